package kube

// The user's path written down: the root README's "Deploy on Kubernetes"
// marks each step's commands as a fenced block with the info string
// `sh deploy:<step>`. TestRealNode runs those blocks (readmeStep) instead of
// its own copies of the same commands, so the README cannot drift from what
// works. What the guest node needs differently is here, in one place, and in
// e2e/kube/README.md:
//   - the image blocks (deploy:images*) are not run: the images are preloaded
//     into the guest's containerd (images-disk.sh);
//   - `helm install` gets `-f e2e/kube/values-e2e.yaml` appended (stand-in CSI
//     sidecar images, the preloaded images' names, no webhook);
//   - the samples a block applies are replaced by edited copies (guestSamples:
//     preloaded images, requests that fit a 2-CPU guest, a smaller memfs and
//     workload, the pod network, the MDS by pod IP in the StorageClass).
//
// TestDeployDocs (no cluster; `make test-docs`, part of `make test`) checks
// that README.md has every block and no unknown one, that the files the
// commands name exist (Dockerfile targets included), that the YAML they
// apply parses into its API types, that the images built are the ones the
// chart and samples use, and that the guest edits apply to those samples.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/render"
)

// deploySteps are the README's blocks, in order. run: TestRealNode runs it
// (the image blocks are for a real cluster: the guest's images are
// preloaded); the others are still checked by TestDeployDocs.
var deploySteps = []struct {
	name string
	run  bool
}{
	{"images", false},
	{"images-kind", false},
	{"install", true},
	{"check-install", true},
	{"label", true},
	{"cluster", true},
	{"check-cluster", true},
	{"storageclass", true},
	{"fio", true},
	{"check-pvc", true},
	{"check-fio", true},
	// The flow's own teardown checks more than the README's removal does
	// (the server volume gone, no NFS mount left on the node).
	{"cleanup", false},
}

const (
	// The e2e's values, appended to the README's `helm install`.
	valuesE2E = "e2e/kube/values-e2e.yaml"
	// Names the README's samples give (the flow reads these objects back).
	pvcName = "fio-data"
	jobName = "fio-kernel"
	cmName  = "fio-workload"
	// What the test log shows of a block's output (the fio log is long).
	readmeLogBytes = 4000
)

// deployBlock is one ```sh deploy:<name> block of README.md.
type deployBlock struct {
	name string
	text string
	line int
}

var deployFence = regexp.MustCompile("^```sh deploy:([a-z0-9-]+)$")

// readDeployBlocks returns README.md's deploy blocks in order. A fence that
// mentions deploy: without the exact form, a duplicate name or an
// unterminated block is an error.
func readDeployBlocks(readme string) ([]deployBlock, error) {
	f, err := os.Open(readme)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var blocks []deployBlock
	seen := map[string]bool{}
	var cur *deployBlock
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		l := strings.TrimRight(sc.Text(), " \t")
		if cur != nil {
			if l == "```" {
				blocks = append(blocks, *cur)
				cur = nil
				continue
			}
			cur.text += l + "\n"
			continue
		}
		if !strings.HasPrefix(l, "```") || !strings.Contains(l, "deploy:") {
			continue
		}
		m := deployFence.FindStringSubmatch(l)
		if m == nil {
			return nil, fmt.Errorf("%s:%d: %q: a deploy block opens with ```sh deploy:<name>", readme, n, l)
		}
		if seen[m[1]] {
			return nil, fmt.Errorf("%s:%d: deploy:%s appears twice", readme, n, m[1])
		}
		seen[m[1]] = true
		cur = &deployBlock{name: m[1], line: n}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: deploy:%s is never closed", readme, cur.line, cur.name)
	}
	return blocks, nil
}

// checkDeployBlocks returns the blocks by name when README.md has exactly
// deploySteps, in that order, each with a command in it.
func checkDeployBlocks(repo string) (map[string]deployBlock, error) {
	blocks, err := readDeployBlocks(filepath.Join(repo, "README.md"))
	if err != nil {
		return nil, err
	}
	var got, want []string
	byName := map[string]deployBlock{}
	for _, b := range blocks {
		got = append(got, b.name)
		byName[b.name] = b
		if len(commandLines(b.text)) == 0 {
			return nil, fmt.Errorf("README.md:%d: deploy:%s has no command", b.line, b.name)
		}
	}
	for _, s := range deploySteps {
		want = append(want, s.name)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		return nil, fmt.Errorf("README.md's deploy blocks are [%s], the e2e runs [%s]: rename them back or update deploySteps and e2e/kube/README.md",
			strings.Join(got, " "), strings.Join(want, " "))
	}
	return byName, nil
}

// commandLines are a block's lines that are not blank or comments.
func commandLines(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			out = append(out, t)
		}
	}
	return out
}

// guestParams is what the guest edits need from earlier steps.
type guestParams struct {
	dir   string // where the edited copies go
	mdsIP string // the MDS pod's IP, once the cluster is up
}

// guestEdit changes one decoded object of a sample for the guest.
type guestEdit func(obj any, p *guestParams) error

// guestSamples: for each sample a README block applies, the edits by kind
// (documents of other kinds are applied as written).
var guestSamples = map[string]map[string]guestEdit{
	"config/samples/storage_v1alpha1_chimeracluster_tcp_memfs.yaml": {"ChimeraCluster": guestCluster},
	"config/samples/storageclass.yaml":                              {"StorageClass": guestClass},
	"config/samples/fio/fio-workload-configmap.yaml":                {"ConfigMap": guestWorkload},
	"config/samples/fio/fio-kernel-job.yaml":                        {"PersistentVolumeClaim": guestClaim, "Job": guestJob},
}

// guestCluster: the TCP/memfs sample scaled to the guest — our image, small
// requests, a small memfs, one event loop per server (three servers share
// 2 vCPUs), and the pod network named (the guest's pods sit on a static CNI
// bridge, 10.88.0.0/24, that is no node pod range: the node's kernel client
// reaches the MDS from the bridge's address, which the export rules admit
// only when named). The nodeSelector stays: the README's label step is what
// lets the servers onto the node.
func guestCluster(obj any, _ *guestParams) error {
	cc := obj.(*chimerav1.ChimeraCluster)
	if cc.Name != clusterName || cc.Namespace != clusterNS || cc.Spec.DataServers.Count == nil || *cc.Spec.DataServers.Count != 2 {
		return fmt.Errorf("the sample changed shape (%s/%s): update the test", cc.Namespace, cc.Name)
	}
	small := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
	}
	cc.Spec.Image = "localhost/chimerad:dev"
	cc.Spec.MetadataServer.Resources = small
	cc.Spec.DataServers.Resources = small
	cc.Spec.Storage.MemfsCapacityBytes = memfsBytes
	cc.Spec.Tuning.Threads = 1
	cc.Spec.Network.PodNetworkCIDRs = []string{"10.88.0.0/24"}
	return nil
}

// guestClass: the sample class names the MDS by its Service's DNS name; the
// guest has no cluster DNS and no kube-proxy, so it names the MDS by pod IP.
func guestClass(obj any, p *guestParams) error {
	if p.mdsIP == "" {
		return fmt.Errorf("the StorageClass needs the MDS pod IP: the cluster is not up")
	}
	guestStorageClass(obj.(*storagev1.StorageClass), p.mdsIP)
	return nil
}

// guestWorkload: verify=crc32c on the layout phase (each block written with
// a checksum header and read back checked), and what the test asserts on
// printed to the pod's log.
func guestWorkload(obj any, _ *guestParams) error {
	cm := obj.(*corev1.ConfigMap)
	if cm.Name != cmName {
		return fmt.Errorf("the workload ConfigMap is %q, want %q: update the test", cm.Name, cmName)
	}
	wl := cm.Data["workload.fio"]
	if !strings.Contains(wl, "[layout]\nrw=write\n") {
		return fmt.Errorf("the sample workload changed shape: update the test")
	}
	cm.Data["workload.fio"] = strings.Replace(wl, "[layout]\nrw=write\n", "[layout]\nrw=write\nverify=crc32c\ndo_verify=1\n", 1)
	cm.Data["run.sh"] += `
for phase in layout randwrite randread; do echo "@@fio-$phase-begin"; cat "/results/$phase.json"; echo "@@fio-$phase-end"; done
echo "@@mountstats-begin"; cat /proc/self/mountstats; echo "@@mountstats-end"
echo "@@sha256-begin"; (cd "$DIRECTORY" && sha256sum *); echo "@@sha256-end"
`
	return nil
}

// guestClaim: a claim the guest's small memfs can give.
func guestClaim(obj any, _ *guestParams) error {
	pvc := obj.(*corev1.PersistentVolumeClaim)
	if pvc.Name != pvcName || pvc.Namespace != clusterNS {
		return fmt.Errorf("the sample claim is %s/%s, want %s/%s: update the test", pvc.Namespace, pvc.Name, clusterNS, pvcName)
	}
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = *resource.NewQuantity(volumeBytes, resource.BinarySI)
	return nil
}

// guestJob: the preloaded fio image, requests that fit, a smaller workload.
func guestJob(obj any, _ *guestParams) error {
	job := obj.(*batchv1.Job)
	spec := &job.Spec.Template.Spec
	if job.Name != jobName || len(spec.Containers) != 1 || len(spec.Volumes) == 0 || spec.Volumes[0].PersistentVolumeClaim == nil ||
		spec.Volumes[0].PersistentVolumeClaim.ClaimName != pvcName {
		return fmt.Errorf("the sample Job changed shape (%s, claim of its first volume): update the test", job.Name)
	}
	smallFio(&spec.Containers[0], "localhost/chimera-fio:dev", fioScale, fioRuntimeS)
	return nil
}

// guestStorageClass points a sample class at the MDS by pod IP
// (adminEndpoint; the NFS server defaults to the same host).
func guestStorageClass(sc *storagev1.StorageClass, mdsIP string) {
	delete(sc.Parameters, "clusterName")
	delete(sc.Parameters, "clusterNamespace")
	sc.Parameters["adminEndpoint"] = fmt.Sprintf("https://%s:%d", mdsIP, render.PortAdmin)
}

// typedObject returns an empty object of an API kind the samples use.
func typedObject(kind string) (any, error) {
	switch kind {
	case "ChimeraCluster":
		return &chimerav1.ChimeraCluster{}, nil
	case "Namespace":
		return &corev1.Namespace{}, nil
	case "ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, nil
	case "StorageClass":
		return &storagev1.StorageClass{}, nil
	case "Job":
		return &batchv1.Job{}, nil
	}
	return nil, fmt.Errorf("kind %q: not one the deploy samples use (add it to typedObject)", kind)
}

// decodeDoc strictly decodes one YAML document into its API type.
func decodeDoc(doc []byte) (string, any, error) {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return "", nil, err
	}
	if meta.APIVersion == "" || meta.Kind == "" || meta.Metadata.Name == "" {
		return "", nil, fmt.Errorf("a document without apiVersion, kind or metadata.name")
	}
	obj, err := typedObject(meta.Kind)
	if err != nil {
		return "", nil, err
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return "", nil, fmt.Errorf("%s %s: %w", meta.Kind, meta.Metadata.Name, err)
	}
	return meta.Kind, obj, nil
}

// editSample writes the guest's copy of a sample (repo-relative path) into
// p.dir and returns its path.
func editSample(repo, rel string, edits map[string]guestEdit, p *guestParams) (string, error) {
	docs, err := readYAMLDocs(filepath.Join(repo, rel))
	if err != nil {
		return "", err
	}
	done := map[string]bool{}
	var out []string
	for _, d := range docs {
		kind, obj, err := decodeDoc(d)
		if err != nil {
			return "", fmt.Errorf("%s: %w", rel, err)
		}
		edit, ok := edits[kind]
		if !ok {
			out = append(out, strings.TrimSpace(string(d)))
			continue
		}
		if err := edit(obj, p); err != nil {
			return "", fmt.Errorf("%s: %w", rel, err)
		}
		b, err := yaml.Marshal(obj)
		if err != nil {
			return "", err
		}
		out = append(out, strings.TrimSpace(string(b)))
		done[kind] = true
	}
	for kind := range edits {
		if !done[kind] {
			return "", fmt.Errorf("%s has no %s to edit for the guest", rel, kind)
		}
	}
	dst := filepath.Join(p.dir, strings.ReplaceAll(rel, "/", "_"))
	return dst, os.WriteFile(dst, []byte(strings.Join(out, "\n---\n")+"\n"), 0o644)
}

// guestCommand is a block's text as the guest runs it: `-f values-e2e.yaml`
// after `helm install`, the samples replaced by their edited copies.
func guestCommand(repo string, b deployBlock, p *guestParams) (string, error) {
	text := b.text
	if b.name == "install" {
		var lines []string
		n := 0
		for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "helm install ") {
				if strings.HasSuffix(l, "\\") {
					return "", fmt.Errorf("deploy:install: keep `helm install` on one line (the e2e appends -f %s)", valuesE2E)
				}
				l += " -f " + valuesE2E
				n++
			}
			lines = append(lines, l)
		}
		if n != 1 {
			return "", fmt.Errorf("deploy:install has %d `helm install` lines, want 1", n)
		}
		text = strings.Join(lines, "\n") + "\n"
	}
	paths := make([]string, 0, len(guestSamples))
	for rel := range guestSamples {
		paths = append(paths, rel)
	}
	sort.Strings(paths)
	for _, rel := range paths {
		if !regexp.MustCompile(regexp.QuoteMeta(rel) + `(\s|$)`).MatchString(text) {
			continue
		}
		dst, err := editSample(repo, rel, guestSamples[rel], p)
		if err != nil {
			return "", err
		}
		text = regexp.MustCompile(regexp.QuoteMeta(rel)+`(\s|$)`).ReplaceAllString(text, dst+"$1")
	}
	return text, nil
}

// readmeStep runs one README block on the cluster: `sh -ec` of its text as
// the guest runs it (guestCommand), from the repository root, with
// KUBECONFIG, helm and kubectl on PATH, and STORAGE_NODES naming the node.
// abort, when not nil, is polled while the block runs: an error from it
// ends the block at once (a failed Job never completes). Returns the
// block's output.
func (e *env) readmeStep(blocks map[string]deployBlock, name string, p *guestParams, budget time.Duration, abort func() error) (string, error) {
	b, ok := blocks[name]
	if !ok {
		return "", fmt.Errorf("README.md has no deploy:%s block", name)
	}
	text, err := guestCommand(e.repo, b, p)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(e.ctx, budget)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-ec", text)
	cmd.Dir = e.repo
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kc, "STORAGE_NODES="+nodeName,
		"PATH="+filepath.Dir(e.kubectl)+":"+filepath.Dir(e.helm)+":"+os.Getenv("PATH"))
	// kubectl runs under sh: a timeout or an abort kills the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	var runErr error
wait:
	for {
		select {
		case runErr = <-done:
			break wait
		case <-tick.C:
			if abort == nil {
				continue
			}
			if aerr := abort(); aerr != nil {
				cancel()
				<-done
				runErr = aerr
				break wait
			}
		}
	}
	shown := out.String()
	if len(shown) > readmeLogBytes {
		shown = shown[:readmeLogBytes] + fmt.Sprintf("\n[... %d more bytes]\n", len(shown)-readmeLogBytes)
	}
	e.t.Logf("README deploy:%s (README.md:%d), as run:\n%s--- output:\n%s", name, b.line, text, shown)
	if ctx.Err() == context.DeadlineExceeded {
		return out.String(), fmt.Errorf("deploy:%s: not done within %v:\n%s", name, budget, out.String())
	}
	if runErr != nil {
		return out.String(), fmt.Errorf("deploy:%s: %v\n%s", name, runErr, out.String())
	}
	return out.String(), nil
}

// mustDeployBlocks fails the test (never skips) when README.md lacks a block.
func mustDeployBlocks(t *testing.T, repo string) map[string]deployBlock {
	t.Helper()
	blocks, err := checkDeployBlocks(repo)
	if err != nil {
		t.Fatalf("the README's deploy path: %v", err)
	}
	return blocks
}

// repoRoot is the repository, from this package's folder.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("not the repository root: %s", root)
	}
	return root
}

var (
	dockerTarget = regexp.MustCompile(`--target[ =](\S+)`)
	dockerTag    = regexp.MustCompile(`(?:-t|--tag)[ =](\S+)`)
	dockerFile   = regexp.MustCompile(`(?:-f|--file)[ =](\S+)`)
	applyFile    = regexp.MustCompile(`(?:^|\s)-f\s+(\S+)`)
)

// TestDeployDocs checks the README's deploy path without a cluster.
func TestDeployDocs(t *testing.T) {
	repo := repoRoot(t)
	blocks := mustDeployBlocks(t, repo)

	// Every path a command names exists (tokens whose first element is a
	// top-level folder or file of the repository).
	top := map[string]bool{}
	entries, err := os.ReadDir(repo)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		top[en.Name()] = true
	}
	var yamls []string
	for _, s := range deploySteps {
		b := blocks[s.name]
		for _, l := range commandLines(b.text) {
			for _, tok := range strings.Fields(l) {
				tok = strings.Trim(tok, `"'`)
				first, _, nested := strings.Cut(tok, "/")
				if !nested || !top[first] || strings.ContainsAny(tok, ":$") {
					continue
				}
				if _, err := os.Stat(filepath.Join(repo, tok)); err != nil {
					t.Errorf("README.md:%d deploy:%s names %s, which is not in the repository", b.line, b.name, tok)
				}
				if strings.HasSuffix(tok, ".yaml") && strings.HasPrefix(tok, "config/") {
					yamls = append(yamls, tok)
				}
			}
		}
	}

	// The YAML the commands apply parses into its API types.
	for _, rel := range yamls {
		docs, err := readYAMLDocs(filepath.Join(repo, rel))
		if err != nil {
			t.Fatal(err)
		}
		if len(docs) == 0 {
			t.Errorf("%s has no documents", rel)
		}
		for _, d := range docs {
			if _, _, err := decodeDoc(d); err != nil {
				t.Errorf("%s: %v", rel, err)
			}
		}
	}

	// Images: every docker build's target exists in its Dockerfile; kind
	// loads what was built; what was built is what the chart and the
	// samples run by default.
	built := map[string]bool{}
	for _, l := range commandLines(blocks["images"].text) {
		if !strings.HasPrefix(l, "docker build ") {
			continue
		}
		target, tag := dockerTarget.FindStringSubmatch(l), dockerTag.FindStringSubmatch(l)
		if target == nil || tag == nil {
			t.Errorf("deploy:images: %q has no --target or -t", l)
			continue
		}
		file := "Dockerfile"
		if m := dockerFile.FindStringSubmatch(l); m != nil {
			file = m[1]
		}
		df, err := os.ReadFile(filepath.Join(repo, file))
		if err != nil {
			t.Errorf("deploy:images: %v", err)
			continue
		}
		if !regexp.MustCompile(`(?mi)^FROM\s+\S+\s+AS\s+` + regexp.QuoteMeta(target[1]) + `\s*$`).Match(df) {
			t.Errorf("deploy:images: %s has no stage %q", file, target[1])
		}
		built[tag[1]] = true
	}
	var loaded []string
	for _, l := range commandLines(blocks["images-kind"].text) {
		if rest, ok := strings.CutPrefix(l, "kind load docker-image "); ok {
			loaded = append(loaded, strings.Fields(rest)...)
		}
	}
	sort.Strings(loaded)
	var builtList []string
	for k := range built {
		builtList = append(builtList, k)
	}
	sort.Strings(builtList)
	if strings.Join(loaded, " ") != strings.Join(builtList, " ") {
		t.Errorf("deploy:images-kind loads %v, deploy:images builds %v", loaded, builtList)
	}
	for _, img := range defaultImages(t, repo) {
		if !built[img] {
			t.Errorf("the deploy path runs image %s by default, deploy:images does not build it (builds %v)", img, builtList)
		}
	}

	// The install command is the release the flow expects; the guest's
	// command appends the e2e values.
	p := &guestParams{dir: t.TempDir(), mdsIP: "10.88.0.9"}
	install, err := guestCommand(repo, blocks["install"], p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"helm install " + releaseName + " charts/chimera ", "--namespace " + releaseNS, " -f " + valuesE2E} {
		if !strings.Contains(install, want) {
			t.Errorf("deploy:install as the guest runs it lacks %q: %s", want, install)
		}
	}

	// Every guest edit applies to a sample a block applies, and its copy parses.
	for rel := range guestSamples {
		var in []string
		for _, s := range deploySteps {
			if s.run && regexp.MustCompile(regexp.QuoteMeta(rel)+`(\s|$)`).MatchString(blocks[s.name].text) {
				in = append(in, s.name)
			}
		}
		if len(in) != 1 {
			t.Errorf("%s is applied by the blocks %v, want exactly one", rel, in)
		}
	}
	for _, s := range deploySteps {
		if !s.run {
			continue
		}
		text, err := guestCommand(repo, blocks[s.name], p)
		if err != nil {
			t.Errorf("deploy:%s for the guest: %v", s.name, err)
			continue
		}
		for _, m := range applyFile.FindAllStringSubmatch(text, -1) {
			if !strings.HasPrefix(m[1], p.dir) {
				continue
			}
			docs, err := readYAMLDocs(m[1])
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range docs {
				kind, obj, err := decodeDoc(d)
				if err != nil {
					t.Errorf("deploy:%s, the guest's copy %s: %v", s.name, filepath.Base(m[1]), err)
					continue
				}
				switch o := obj.(type) {
				case *chimerav1.ChimeraCluster:
					if o.Spec.Image != "localhost/chimerad:dev" || o.Spec.DataServers.NodeSelector["chimera.io/storage"] != "true" {
						t.Errorf("the guest's %s: image %q, DS nodeSelector %v", kind, o.Spec.Image, o.Spec.DataServers.NodeSelector)
					}
				case *storagev1.StorageClass:
					if o.Parameters["adminEndpoint"] != fmt.Sprintf("https://10.88.0.9:%d", render.PortAdmin) || o.Parameters["clusterName"] != "" {
						t.Errorf("the guest's StorageClass parameters: %v", o.Parameters)
					}
				case *batchv1.Job:
					if c := o.Spec.Template.Spec.Containers[0]; c.Image != "localhost/chimera-fio:dev" || c.ImagePullPolicy != corev1.PullNever {
						t.Errorf("the guest's Job runs %s (%s)", c.Image, c.ImagePullPolicy)
					}
				}
			}
		}
	}
}

// defaultImages are the images the deploy path runs when nothing is set:
// the chart's operator, CSI driver and fuse sidecar at its appVersion, the
// ChimeraCluster sample's chimerad, the fio Job's image.
func defaultImages(t *testing.T, repo string) []string {
	t.Helper()
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(repo, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(read("charts/chimera/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	var values struct {
		Operator struct {
			Image struct{ Repository, Tag string } `json:"image"`
		} `json:"operator"`
		FuseSidecar struct {
			Image struct{ Repository, Tag string } `json:"image"`
		} `json:"fuseSidecar"`
	}
	if err := yaml.Unmarshal([]byte(read("charts/chimera/values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	csi := regexp.MustCompile(`"image" \(dict "repository" "([^"]+)"`).FindStringSubmatch(read("charts/chimera/templates/csi-helpers.yaml"))
	if csi == nil || values.Operator.Image.Repository == "" || values.FuseSidecar.Image.Repository == "" || chart.AppVersion == "" {
		t.Fatalf("the chart's default images moved (operator %q, fuse sidecar %q, csi %v, appVersion %q): update the test",
			values.Operator.Image.Repository, values.FuseSidecar.Image.Repository, csi, chart.AppVersion)
	}
	imgs := []string{
		values.Operator.Image.Repository + ":" + chart.AppVersion,
		csi[1] + ":" + chart.AppVersion,
		values.FuseSidecar.Image.Repository + ":" + chart.AppVersion,
	}
	cc := &chimerav1.ChimeraCluster{}
	if err := sampleObject(filepath.Join(repo, "config/samples/storage_v1alpha1_chimeracluster_tcp_memfs.yaml"), "ChimeraCluster", cc); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{}
	if err := sampleObject(filepath.Join(repo, "config/samples/fio/fio-kernel-job.yaml"), "Job", job); err != nil {
		t.Fatal(err)
	}
	return append(imgs, cc.Spec.Image, job.Spec.Template.Spec.Containers[0].Image)
}
