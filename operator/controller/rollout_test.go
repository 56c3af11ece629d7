package controller_test

// Proves the rolling update against the real apiserver, with a recording
// fake of the MDS admin API (PUT /api/v1/dataservers, GET /api/v1/cluster)
// and a fake kubelet + StatefulSet controller (envtest runs neither: the
// test recreates each pod the operator deletes, from the StatefulSet's
// current template, and marks it ready). Each test changes something that
// changes the revision (spec.image, a rendered config field) and reads back
// the order of what happened: every DS is drained (pushed draining, then
// reported with no layouts held) before its pod is deleted, and undrained
// only after its replacement is ready; one DS at a time, in ordinal order;
// the MDS last — never on memfs without the opt-in; a pod that never
// becomes ready, or a drain the MDS refuses, stops the rollout with a
// condition naming the step and pod.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/render"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// rolloutTimeout bounds a whole rollout of a few pods (each step waits for a
// reconcile, at most RolloutPollInterval apart).
const rolloutTimeout = 120 * time.Second

// rolloutLog is the ordered record both fakes write to.
type rolloutLog struct {
	mu          sync.Mutex
	events      []string
	maxDraining int
	snapshots   map[string]string // pod → status.rollout seen when its deletion was noticed
	// graceGets: how many more GET /api/v1/cluster answer the MDS in its
	// grace period (set when the fake kubelet recreates the MDS pod).
	graceGets int
	// staleForever: the DS whose stale copies never resync.
	staleForever string
}

func (l *rolloutLog) add(e string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *rolloutLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

func (l *rolloutLog) has(e string) bool {
	for _, x := range l.all() {
		if x == e {
			return true
		}
	}
	return false
}

type pushedDS struct {
	Name     string `json:"name"`
	Address  string `json:"address"`
	Ready    bool   `json:"ready"`
	Draining bool   `json:"draining"`
}

// rolloutMDS fakes the MDS admin API the rollout uses. A DS that starts
// draining is reported holding one layout on the first GET /api/v1/cluster
// and none after (the operator must wait for that); "drained X" is logged
// when it first reports none. A DS undrained is reported with a stale copy
// on the next two GETs ("resynced X" logged when it first reports none): the
// operator must not drain the next DS before. An MDS pod just recreated is
// in its grace period for log.graceGets GETs ("grace over" logged after).

func rolloutMDS(t *testing.T, c *chimerav1.ChimeraCluster, token string, log *rolloutLog, refuseDrainOf string) string {
	var mu sync.Mutex
	var list []pushedDS
	draining := map[string]bool{}
	held := map[string]int{}
	drainedTold := map[string]bool{}
	stale := map[string]int{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"error":"missing or invalid bearer token"}`, http.StatusUnauthorized)
			return
		}
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/api/v1/access/data":
			_, _ = w.Write([]byte(`{"mount":"data","access":[]}`))
		case r.Method == http.MethodPut && r.URL.Path == "/api/v1/dataservers":
			var in struct {
				DataServers []pushedDS `json:"dataServers"`
			}
			if err := json.Unmarshal(b, &in); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			for _, d := range in.DataServers {
				if d.Draining && d.Name == refuseDrainOf {
					http.Error(w, `{"error":"dataServers: draining refused by the test"}`, http.StatusConflict)
					return
				}
			}
			n := 0
			for _, d := range in.DataServers {
				switch {
				case d.Draining && !draining[d.Name]:
					log.add("drain " + d.Name)
					held[d.Name], drainedTold[d.Name] = 1, false
				case !d.Draining && draining[d.Name]:
					if !d.Ready {
						log.add("undrain " + d.Name + " while not ready")
					}
					log.add("undrain " + d.Name)
					stale[d.Name] = 2
				}
				draining[d.Name] = d.Draining
				if d.Draining {
					n++
				}
			}
			log.mu.Lock()
			log.maxDraining = max(log.maxDraining, n)
			log.mu.Unlock()
			list = in.DataServers
			out, _ := json.Marshal(map[string]any{"dataServers": list})
			_, _ = w.Write(out)
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/cluster":
			var ds []map[string]any
			log.mu.Lock()
			forever := log.staleForever
			grace := 0
			if log.graceGets > 0 {
				log.graceGets--
				grace = 30000
				if log.graceGets == 0 {
					log.events = append(log.events, "grace over")
				}
			}
			log.mu.Unlock()
			for _, d := range list {
				h := held[d.Name]
				if d.Draining && h > 0 {
					held[d.Name]--
				} else if d.Draining && !drainedTold[d.Name] {
					drainedTold[d.Name] = true
					log.add("drained " + d.Name)
				}
				sc := 0
				switch {
				case d.Name == forever:
					sc = 3
				case stale[d.Name] > 0:
					sc = 1
					if stale[d.Name]--; stale[d.Name] == 0 {
						log.add("resynced " + d.Name)
					}
				}
				ds = append(ds, map[string]any{"name": d.Name, "address": d.Address, "ready": d.Ready, "draining": d.Draining,
					"healthy": true, "layoutsHeld": h, "staleCopies": sc})
			}
			out, _ := json.Marshal(map[string]any{"role": "mds", "graceRemainingMs": grace, "pnfs": map[string]any{"enabled": true, "dataServers": ds}})
			_, _ = w.Write(out)
		default:
			http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
		}
	})}
	return serveAdminTLS(t, c, srv)
}

// createPod makes a pod as its StatefulSet controller would from the
// current template (revision annotation) and reports it Running with an IP,
// ready or not.
func createPod(ctx context.Context, c *chimerav1.ChimeraCluster, name, component, ip string, ready bool) error {
	rev, err := stsRevision(ctx, c, component)
	if err != nil {
		return err
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: name, Labels: render.Labels(c, component),
			Annotations: map[string]string{render.AnnotationRevision: rev}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "chimerad", Image: c.Spec.Image}}},
	}
	if err := k8s.Create(ctx, p); err != nil {
		return err
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}
	return k8s.Status().Update(ctx, p)
}

// fakeKubelet recreates every pod of pods (name → IP) that disappears,
// logging "deleted X" and then "ready X" (or "started X" for the pods in
// neverReady), until ctx ends.
func fakeKubelet(ctx context.Context, c *chimerav1.ChimeraCluster, pods map[string]string, neverReady string, log *rolloutLog) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for name, ip := range pods {
				err := k8s.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: name}, &corev1.Pod{})
				if !apierrors.IsNotFound(err) {
					continue
				}
				cur := &chimerav1.ChimeraCluster{}
				if k8s.Get(ctx, client.ObjectKeyFromObject(c), cur) == nil && cur.Status.Rollout != nil {
					log.mu.Lock()
					log.snapshots[name] = fmt.Sprintf("pod=%s updated=%d", cur.Status.Rollout.Pod, cur.Status.Rollout.DataServersUpdated)
					log.mu.Unlock()
				}
				log.add("deleted " + name)
				component := render.ComponentDS
				if strings.Contains(name, "-mds-") {
					component = render.ComponentMDS
				}
				ready := name != neverReady
				if component == render.ComponentMDS {
					log.mu.Lock()
					log.graceGets = 3
					log.mu.Unlock()
				}
				if err := createPod(ctx, c, name, component, ip, ready); err != nil {
					log.add("recreate " + name + " failed: " + err.Error())
					continue
				}
				if ready {
					log.add("ready " + name)
				} else {
					log.add("started " + name)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return done
}

// rollingCluster creates a cluster with n DSes, its fake MDS and ready pods
// at the current revision, waits until it is up to date, and starts the fake
// kubelet. It returns the cluster and the log.
func rollingCluster(t *testing.T, name string, n int, mutate func(*chimerav1.ChimeraCluster), neverReady string, refuseDrainOf ...string) (*chimerav1.ChimeraCluster, *rolloutLog) {
	t.Helper()
	ctx := context.Background()
	ns := namespace(t, name)
	c := validCluster(ns, name)
	c.Spec.DataServers.Count = i32(int32(n))
	if mutate != nil {
		mutate(c)
	}
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{}
	eventually(t, "admin Secret", func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-admin-token"}, sec)
	})
	log := &rolloutLog{snapshots: map[string]string{}}
	refuse := ""
	if len(refuseDrainOf) > 0 {
		refuse = refuseDrainOf[0]
	}
	adminURL.url.Store(rolloutMDS(t, c, string(sec.Data["token"]), log, refuse))
	pods := map[string]string{name + "-mds-0": "10.0.9.10"}
	makePod(t, c, name+"-mds-0", render.ComponentMDS, "10.0.9.10", "", true)
	for i := 0; i < n; i++ {
		pod, ip := fmt.Sprintf("%s-ds-%d", name, i), fmt.Sprintf("10.0.9.%d", 11+i)
		makePod(t, c, pod, render.ComponentDS, ip, "", true)
		pods[pod] = ip
	}
	eventually(t, "up to date, available", func() error {
		cur := get(t, c)
		u := meta.FindStatusCondition(cur.Status.Conditions, chimerav1.ConditionUpToDate)
		if cur.Status.Phase != chimerav1.PhaseAvailable || u == nil || u.Status != metav1.ConditionTrue {
			return fmt.Errorf("phase %s UpToDate %+v", cur.Status.Phase, u)
		}
		return nil
	})
	if got := log.all(); len(got) != 0 {
		t.Fatalf("a new cluster's pods were touched: %v", got)
	}
	kctx, cancel := context.WithCancel(ctx)
	done := fakeKubelet(kctx, c, pods, neverReady, log)
	t.Cleanup(func() { cancel(); <-done })
	return c, log
}

func get(t *testing.T, c *chimerav1.ChimeraCluster) *chimerav1.ChimeraCluster {
	t.Helper()
	cur := &chimerav1.ChimeraCluster{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(c), cur); err != nil {
		t.Fatal(err)
	}
	return cur
}

// change updates c's spec (retrying conflicts with the reconciler) and
// returns the DS StatefulSet's new revision once the operator applied it.
func change(t *testing.T, c *chimerav1.ChimeraCluster, mutate func(*chimerav1.ChimeraCluster)) string {
	t.Helper()
	ctx := context.Background()
	before, err := stsRevision(ctx, c, render.ComponentDS)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "spec change accepted", func() error {
		cur := get(t, c)
		mutate(cur)
		return k8s.Update(ctx, cur)
	})
	var rev string
	eventually(t, "a new revision in the templates", func() error {
		rev, err = stsRevision(ctx, c, render.ComponentDS)
		if err == nil && rev == before {
			err = fmt.Errorf("revision still %s", before)
		}
		return err
	})
	if mds, _ := stsRevision(ctx, c, render.ComponentMDS); mds != rev {
		t.Fatalf("MDS template revision %s, DS template %s: one revision names both", mds, rev)
	}
	return rev
}

// waitCondition polls until UpToDate has reason (and, if not "", a message
// containing each of words) within d.
func waitCondition(t *testing.T, c *chimerav1.ChimeraCluster, d time.Duration, reason string, words ...string) *chimerav1.ChimeraCluster {
	t.Helper()
	deadline := time.Now().Add(d)
	var cur *chimerav1.ChimeraCluster
	for {
		cur = get(t, c)
		u := meta.FindStatusCondition(cur.Status.Conditions, chimerav1.ConditionUpToDate)
		ok := u != nil && u.Reason == reason
		for _, w := range words {
			ok = ok && strings.Contains(u.Message, w)
		}
		if ok {
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for UpToDate reason %s %v: %+v, rollout %+v", d, reason, words, u, cur.Status.Rollout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rolled is the log of rolling the DSes in order, then (if mds) the MDS.
func rolled(name string, n int, mds bool) []string {
	var want []string
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("%s-ds-%d", name, i)
		want = append(want, "drain "+p, "drained "+p, "deleted "+p, "ready "+p, "undrain "+p, "resynced "+p)
	}
	if mds {
		want = append(want, "deleted "+name+"-mds-0", "ready "+name+"-mds-0", "grace over")
	}
	return want
}

func sameLog(t *testing.T, log *rolloutLog, want []string) {
	t.Helper()
	got := log.all()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rollout did:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if log.maxDraining > 1 {
		t.Fatalf("%d data servers draining at once", log.maxDraining)
	}
}

func TestRolloutImageChangeRollsDataServersOneAtATimeThenTheMDS(t *testing.T) {
	c, log := rollingCluster(t, "roll", 3, durable, "")
	rev := change(t, c, func(c *chimerav1.ChimeraCluster) { c.Spec.Image = "localhost/chimera/chimerad:v2" })
	cur := waitCondition(t, c, rolloutTimeout, "AllPodsAtRevision", rev)
	sameLog(t, log, rolled("roll", 3, true))
	r := cur.Status.Rollout
	if r.Revision != rev || r.DataServersUpdated != 3 || r.DataServers != 3 || !r.MetadataServerUpdated || r.Pod != "" || r.Failure != "" {
		t.Fatalf("status.rollout at the end: %+v", r)
	}
	// While roll-ds-1 was replaced, status named it and counted roll-ds-0 done.
	log.mu.Lock()
	snap := log.snapshots["roll-ds-1"]
	log.mu.Unlock()
	if snap != "pod=roll-ds-1 updated=1" {
		t.Fatalf("status.rollout while roll-ds-1 was replaced: %q", snap)
	}
	for _, name := range []string{"roll-mds-0", "roll-ds-0", "roll-ds-1", "roll-ds-2"} {
		p := &corev1.Pod{}
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: c.Namespace, Name: name}, p); err != nil {
			t.Fatal(err)
		}
		if p.Annotations[render.AnnotationRevision] != rev {
			t.Fatalf("pod %s has revision %q, want %s", name, p.Annotations[render.AnnotationRevision], rev)
		}
	}
	// Nothing else happens once up to date (a resync later).
	n := len(log.all())
	time.Sleep(3 * time.Second)
	if got := log.all(); len(got) != n {
		t.Fatalf("pods touched after the rollout: %v", got[n:])
	}
}

func TestRolloutStopsAtADataServerThatNeverBecomesReady(t *testing.T) {
	c, log := rollingCluster(t, "stuck", 3, func(c *chimerav1.ChimeraCluster) {
		c.Spec.Rollout.PodReadyTimeoutSeconds = 3
	}, "stuck-ds-1")
	change(t, c, func(c *chimerav1.ChimeraCluster) { c.Spec.Image = "localhost/chimera/chimerad:broken" })
	cur := waitCondition(t, c, rolloutTimeout, "RolloutFailed", "WaitReady", "stuck-ds-1", "not ready within 3s")
	if p := meta.FindStatusCondition(cur.Status.Conditions, chimerav1.ConditionProgressing); p == nil || p.Reason != "RolloutFailed" || p.Status != metav1.ConditionFalse {
		t.Fatalf("Progressing %+v", p)
	}
	if r := cur.Status.Rollout; r.Pod != "stuck-ds-1" || r.Step != chimerav1.RolloutStepWaitReady || r.DataServersUpdated != 2 {
		// ds-0 and the new (not ready) ds-1 run the revision.
		t.Fatalf("status.rollout %+v", r)
	}
	// Stopped: no other pod is touched, and the stuck DS stays draining.
	time.Sleep(4 * time.Second)
	want := append(rolled("stuck", 1, false), "drain stuck-ds-1", "drained stuck-ds-1", "deleted stuck-ds-1", "started stuck-ds-1")
	sameLog(t, log, want)

	// The pod turns ready by itself: the rollout resumes and finishes the
	// data servers (the memfs MDS then waits for its opt-in).
	p := &corev1.Pod{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: c.Namespace, Name: "stuck-ds-1"}, p); err != nil {
		t.Fatal(err)
	}
	setPodStatus(t, p, "10.0.9.12", true)
	waitCondition(t, c, rolloutTimeout, "MetadataServerRestartRefused")
	want = append(want, "undrain stuck-ds-1", "resynced stuck-ds-1", "drain stuck-ds-2", "drained stuck-ds-2", "deleted stuck-ds-2", "ready stuck-ds-2", "undrain stuck-ds-2", "resynced stuck-ds-2")
	sameLog(t, log, want)
}

func TestRolloutOfAConfigChangeLeavesAMemfsMDSUntilOptedIn(t *testing.T) {
	c, log := rollingCluster(t, "cfg", 2, nil, "")
	before := get(t, c).Status.Rollout.Revision
	// A rendered config field, not the image.
	rev := change(t, c, func(c *chimerav1.ChimeraCluster) { c.Spec.PNFS.StripeUnitBytes = 2 << 20 })
	if rev == before {
		t.Fatal("a config change kept the revision")
	}
	cur := waitCondition(t, c, rolloutTimeout, "MetadataServerRestartRefused", "allowMemfsMetadataServerRestart", "loses")
	if r := cur.Status.Rollout; r.DataServersUpdated != 2 || r.MetadataServerUpdated || r.Pod != "" {
		t.Fatalf("status.rollout %+v", r)
	}
	ev := &corev1.EventList{}
	if err := k8s.List(context.Background(), ev, client.InNamespace(c.Namespace)); err != nil {
		t.Fatal(err)
	}
	warned := false
	for _, e := range ev.Items {
		warned = warned || (e.Reason == "MetadataServerRestartRefused" && e.Type == corev1.EventTypeWarning && e.InvolvedObject.Name == "cfg")
	}
	if !warned {
		t.Fatal("no MetadataServerRestartRefused warning event on the cluster")
	}
	time.Sleep(3 * time.Second)
	sameLog(t, log, rolled("cfg", 2, false))

	// The user opts in: the MDS is replaced, last.
	change := func(c *chimerav1.ChimeraCluster) { c.Spec.Rollout.AllowMemfsMetadataServerRestart = true }
	eventually(t, "opt-in accepted", func() error {
		cur := get(t, c)
		change(cur)
		return k8s.Update(context.Background(), cur)
	})
	waitCondition(t, c, rolloutTimeout, "AllPodsAtRevision", rev)
	sameLog(t, log, rolled("cfg", 2, true))
}

func TestRolloutStopsWhenTheMDSRefusesTheDrain(t *testing.T) {
	c, log := rollingCluster(t, "refuse", 2, durable, "", "refuse-ds-1")
	change(t, c, func(c *chimerav1.ChimeraCluster) { c.Spec.Image = "localhost/chimera/chimerad:v3" })
	cur := waitCondition(t, c, rolloutTimeout, "RolloutFailed", "step Drain of pod refuse-ds-1", "the MDS refused the drain", "HTTP 409")
	if r := cur.Status.Rollout; r.Pod != "refuse-ds-1" || r.DataServersUpdated != 1 || r.MetadataServerUpdated {
		t.Fatalf("status.rollout %+v", r)
	}
	// Stopped before touching refuse-ds-1 (nor the MDS); the list is pushed
	// again without the refused drain, so the MDS keeps hearing of the DSes.
	time.Sleep(3 * time.Second)
	sameLog(t, log, rolled("refuse", 1, false))
	eventually(t, "DS list pushed again", func() error {
		cur := get(t, c)
		if d := meta.FindStatusCondition(cur.Status.Conditions, chimerav1.ConditionDegraded); d != nil && d.Reason == "DataServerPushFailed" {
			return fmt.Errorf("Degraded %+v", d)
		}
		return nil
	})
}

func TestRolloutWaitsForStaleMirrorCopiesAndStopsWhenTheyStay(t *testing.T) {
	c, log := rollingCluster(t, "stale", 2, func(c *chimerav1.ChimeraCluster) {
		durable(c)
		c.Spec.Rollout.ResyncTimeoutSeconds = 3
	}, "")
	log.mu.Lock()
	log.staleForever = "stale-ds-0" // its copies are stale until the MDS says otherwise
	log.mu.Unlock()
	change(t, c, func(c *chimerav1.ChimeraCluster) { c.Spec.Image = "localhost/chimera/chimerad:v4" })
	cur := waitCondition(t, c, rolloutTimeout, "RolloutFailed", "step Resync of pod stale-ds-0", "not resynced within 3s", "stale-ds-0: 3")
	if r := cur.Status.Rollout; r.Pod != "stale-ds-0" || r.Step != chimerav1.RolloutStepResync || r.DataServersUpdated != 1 {
		t.Fatalf("status.rollout %+v", r)
	}
	// Stopped: stale-ds-1 (which may hold the only good copies) is not drained.
	time.Sleep(3 * time.Second)
	sameLog(t, log, []string{"drain stale-ds-0", "drained stale-ds-0", "deleted stale-ds-0", "ready stale-ds-0", "undrain stale-ds-0"})
}
