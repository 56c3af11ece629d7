package render

import (
	"fmt"
	"sort"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Children is everything one ChimeraCluster owns, as the reconciler applies it.
type Children struct {
	ConfigMap     *corev1.ConfigMap
	MDSService    *corev1.Service
	DSService     *corev1.Service
	MDS           *appsv1.StatefulSet
	DSStatefulSet *appsv1.StatefulSet // exactly one of DSStatefulSet / DSDaemonSet
	DSDaemonSet   *appsv1.DaemonSet
	MDSBudget     *policyv1.PodDisruptionBudget
	DSBudget      *policyv1.PodDisruptionBudget
	// Revision is what every server pod should run (Revision()); the pod
	// templates carry it as AnnotationRevision.
	Revision string
}

// Objects lists the children in apply order (config before the pods using it).
func (ch *Children) Objects() []client.Object {
	objs := []client.Object{ch.ConfigMap, ch.MDSService, ch.DSService, ch.MDS}
	if ch.DSStatefulSet != nil {
		objs = append(objs, ch.DSStatefulSet)
	}
	if ch.DSDaemonSet != nil {
		objs = append(objs, ch.DSDaemonSet)
	}
	return append(objs, ch.MDSBudget, ch.DSBudget)
}

// Build computes every child of c except the admin Secret (whose token is
// random and therefore created once, see AdminSecret). access is the MDS
// export's client rules (ExportAccess), written into the MDS config but not
// into the config hash: a change of rules reaches the running MDS through
// the admin API and must not restart the pods.
func Build(c *chimerav1.ChimeraCluster, access []AccessRule) (*Children, error) {
	if c.Spec.Storage.Backend == chimerav1.BackendNVMe && c.Spec.MetadataServer.Storage == nil {
		// Admission refuses this (CEL and webhook); never render an MDS
		// whose namespace would have nowhere to live.
		return nil, fmt.Errorf("spec.metadataServer.storage is required with storage.backend nvme")
	}
	mdsCfg, err := RenderConfig(c, ComponentMDS, access)
	if err != nil {
		return nil, err
	}
	mdsHashed, err := RenderConfig(c, ComponentMDS, nil)
	if err != nil {
		return nil, err
	}
	dsCfg, err := RenderConfig(c, ComponentDS, nil)
	if err != nil {
		return nil, err
	}
	data := map[string]string{ConfigKeyMDS: string(mdsCfg), ConfigKeyDS: string(dsCfg)}
	hashed := [][]byte{mdsHashed, dsCfg}
	if usesStartScript(c) {
		data[ConfigKeyStart] = StartScript
		hashed = append(hashed, []byte(StartScript))
	}
	hash := ConfigHash(hashed...)
	rev := Revision(c.Spec.Image, hash)
	mds := statefulSet(c, MDSName(c), ComponentMDS, 1, podTemplate(c, ComponentMDS, hash, rev))
	if usesStartScript(c) { // backend nvme: the namespace lives on the metadata claim
		mds.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{metadataClaim(c, c.Spec.MetadataServer.Storage)}
		// Deleting the cluster (or scaling) must not delete the namespace.
		mds.Spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
			WhenDeleted: appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
			WhenScaled:  appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
		}
	}
	ch := &Children{
		ConfigMap: &corev1.ConfigMap{
			ObjectMeta: objectMeta(c, ConfigMapName(c), ""),
			Data:       data,
		},
		MDSService: headlessService(c, MDSName(c), ComponentMDS),
		DSService:  headlessService(c, DSName(c), ComponentDS),
		MDS:        mds,
		MDSBudget:  budget(c, MDSName(c), ComponentMDS, false),
		DSBudget:   budget(c, DSName(c), ComponentDS, true),
		Revision:   rev,
	}
	dsPod := podTemplate(c, ComponentDS, hash, rev)
	if c.Spec.DataServers.Mode == chimerav1.DataServerModeDaemonSet {
		ch.DSDaemonSet = &appsv1.DaemonSet{
			ObjectMeta: objectMeta(c, DSName(c), ComponentDS),
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: SelectorLabels(c, ComponentDS)},
				Template: dsPod,
				// The operator replaces the pods itself, one at a time,
				// each drained at the MDS first (controller/rollout.go).
				UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType},
			},
		}
	} else {
		ch.DSStatefulSet = statefulSet(c, DSName(c), ComponentDS, DesiredDataServers(c), dsPod)
		if v := dataVolumeClaim(c); v != nil { // each DS's data on its own volume
			ch.DSStatefulSet.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{volumeClaim(c, ComponentDS, DataClaimName, v.StorageClassName, v.Size)}
			ch.DSStatefulSet.Spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
				WhenDeleted: appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
				WhenScaled:  appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
			}
		}
	}
	return ch, nil
}

// metadataClaim is the MDS's metadata volume (spec.metadataServer.storage).
func metadataClaim(c *chimerav1.ChimeraCluster, st *chimerav1.MetadataStorageSpec) corev1.PersistentVolumeClaim {
	return volumeClaim(c, ComponentMDS, MetadataClaimName, st.StorageClassName, st.Size)
}

// volumeClaim is a server's claim template: one Filesystem volume of class.
func volumeClaim(c *chimerav1.ChimeraCluster, component, name, class string, size resource.Quantity) corev1.PersistentVolumeClaim {
	fs := corev1.PersistentVolumeFilesystem
	return corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: Labels(c, component)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			VolumeMode:       &fs,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
}

// AdminTLSSecret holds the MDS's admin server certificate and key (issued
// for AdminTLSNames) and the CA that signed it, mounted at AdminTLSDir.
func AdminTLSSecret(c *chimerav1.ChimeraCluster, certPEM, keyPEM, caPEM []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: objectMeta(c, AdminTLSSecretName(c), ""),
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM, SecretKeyCA: caPEM},
	}
}

// AdminSecret holds the bearer token of the MDS admin API.
func AdminSecret(c *chimerav1.ChimeraCluster, token string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: objectMeta(c, AdminSecretName(c), ""),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{SecretKeyToken: []byte(token)},
	}
}

func objectMeta(c *chimerav1.ChimeraCluster, name, component string) metav1.ObjectMeta {
	labels := map[string]string{LabelName: "chimera", LabelInstance: c.Name, LabelManagedBy: ManagedBy, LabelCluster: c.Name}
	if component != "" {
		labels = Labels(c, component)
	}
	return metav1.ObjectMeta{Name: name, Namespace: c.Namespace, Labels: labels}
}

func headlessService(c *chimerav1.ChimeraCluster, name, component string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: objectMeta(c, name, component),
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  SelectorLabels(c, component),
			// Per-pod DNS must exist before readiness: the operator talks to
			// the MDS admin API to make it ready in the first place.
			PublishNotReadyAddresses: true,
			Ports:                    servicePorts(c, component),
		},
	}
}

func servicePorts(c *chimerav1.ChimeraCluster, component string) []corev1.ServicePort {
	var ports []corev1.ServicePort
	for _, p := range containerPorts(c, component) {
		ports = append(ports, corev1.ServicePort{Name: p.Name, Port: p.ContainerPort, TargetPort: intstr.FromString(p.Name), Protocol: corev1.ProtocolTCP})
	}
	return ports
}

func containerPorts(c *chimerav1.ChimeraCluster, component string) []corev1.ContainerPort {
	ports := []corev1.ContainerPort{
		{Name: "nfs", ContainerPort: TCPPort(c), Protocol: corev1.ProtocolTCP},
		{Name: "mount", ContainerPort: PortMount, Protocol: corev1.ProtocolTCP},
	}
	if Transport(c) == chimerav1.TransportRDMA {
		ports = append(ports, corev1.ContainerPort{Name: "nfs-rdma", ContainerPort: ClientPort(c), Protocol: corev1.ProtocolTCP})
	}
	if component == ComponentMDS {
		ports = append(ports, corev1.ContainerPort{Name: "admin", ContainerPort: PortAdmin, Protocol: corev1.ProtocolTCP})
	}
	return append(ports, corev1.ContainerPort{Name: "metrics", ContainerPort: PortMetrics, Protocol: corev1.ProtocolTCP})
}

func statefulSet(c *chimerav1.ChimeraCluster, name, component string, replicas int32, tpl corev1.PodTemplateSpec) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{
		ObjectMeta: objectMeta(c, name, component),
		Spec: appsv1.StatefulSetSpec{
			Replicas:    &replicas,
			ServiceName: name,
			Selector:    &metav1.LabelSelector{MatchLabels: SelectorLabels(c, component)},
			Template:    tpl,
			// Servers are independent: start them together, not one by one.
			PodManagementPolicy: appsv1.ParallelPodManagement,
			// A template change restarts nothing by itself: the operator
			// deletes the pods in order, draining each DS at the MDS
			// first and the MDS last (controller/rollout.go).
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
		},
	}
}

// budget: the single MDS may not be evicted voluntarily (a drain waits for a
// human, since clients lose the namespace meanwhile and a memfs MDS loses
// every file); DSes go one at a time, and a DS that is not ready may always
// be evicted (it serves nothing; keeping it would only block the drain).
func budget(c *chimerav1.ChimeraCluster, name, component string, ds bool) *policyv1.PodDisruptionBudget {
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: objectMeta(c, name, component),
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: SelectorLabels(c, component)}},
	}
	if ds {
		one := intstr.FromInt32(1)
		always := policyv1.AlwaysAllow
		pdb.Spec.MaxUnavailable = &one
		pdb.Spec.UnhealthyPodEvictionPolicy = &always
	} else {
		one := intstr.FromInt32(1)
		pdb.Spec.MinAvailable = &one
	}
	return pdb
}

func placementFor(c *chimerav1.ChimeraCluster, component string) (chimerav1.Placement, corev1.ResourceRequirements) {
	if component == ComponentMDS {
		return c.Spec.MetadataServer.Placement, c.Spec.MetadataServer.Resources
	}
	return c.Spec.DataServers.Placement, c.Spec.DataServers.Resources
}

func podTemplate(c *chimerav1.ChimeraCluster, component, configHash, revision string) corev1.PodTemplateSpec {
	placement, res := placementFor(c, component)
	annotations := map[string]string{AnnotationConfigHash: configHash, AnnotationRevision: revision}
	if nad := c.Spec.Network.NetworkAttachment; nad != "" {
		annotations[AnnotationNetworks] = nad
	}
	cfgKey := ConfigKeyDS
	if component == ComponentMDS {
		cfgKey = ConfigKeyMDS
	}
	volumes := []corev1.Volume{{
		Name: "config",
		VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: ConfigMapName(c)},
		}},
	}}
	mounts := []corev1.VolumeMount{{Name: "config", MountPath: ConfigDir, ReadOnly: true}}
	if component == ComponentMDS {
		volumes = append(volumes, corev1.Volume{Name: "admin-token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: AdminSecretName(c)}}})
		mounts = append(mounts, corev1.VolumeMount{Name: "admin-token", MountPath: AdminTokenDir, ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: "admin-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: AdminTLSSecretName(c)}}})
		mounts = append(mounts, corev1.VolumeMount{Name: "admin-tls", MountPath: AdminTLSDir, ReadOnly: true})
	}
	if medium := hugePageMedium(c, res); medium != "" {
		volumes = append(volumes, corev1.Volume{Name: "hugepages", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: medium}}})
		mounts = append(mounts, corev1.VolumeMount{Name: "hugepages", MountPath: HugePagesDir})
	}
	nvme := c.Spec.Storage.NVMe
	// Only DS pods take NVMe devices: pNFS file data lives on the DSes, and
	// device-plugin devices are exclusive, so an MDS holding a node's devices
	// would leave none for the DS next to it (the reference layout runs the
	// MDS and a DS on the same node; the fake-cluster e2e caught this).
	useNVMe := c.Spec.Storage.Backend == chimerav1.BackendNVMe && nvme != nil && component == ComponentDS
	if useNVMe && len(nvme.PCIAddresses) > 0 {
		hostDir := corev1.HostPathDirectory
		volumes = append(volumes, corev1.Volume{Name: "vfio", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: VFIODir, Type: &hostDir}}})
		mounts = append(mounts, corev1.VolumeMount{Name: "vfio", MountPath: VFIODir})
	}
	if useNVMe && len(nvme.DevicePaths) > 0 {
		// Each block device at its own path: the config names these paths.
		blockDev := corev1.HostPathBlockDev
		for i, p := range nvme.DevicePaths {
			name := fmt.Sprintf("block-%d", i)
			volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: string(p), Type: &blockDev}}})
			mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: string(p)})
		}
	}
	command, args := []string(nil), []string{"--config", ConfigDir + "/" + cfgKey}
	var env []corev1.EnvVar
	if usesStartScript(c) {
		volumes = append(volumes, corev1.Volume{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptrQuantity(resource.MustParse("16Mi"))}}})
		mounts = append(mounts, corev1.VolumeMount{Name: "run", MountPath: RunDir})
		command = []string{"/bin/sh", ConfigDir + "/" + ConfigKeyStart}
		args = []string{ConfigDir + "/" + cfgKey, RunDir + "/" + cfgKey}
		env = startEnv(c, component)
		if component == ComponentMDS {
			mounts = append(mounts, corev1.VolumeMount{Name: MetadataClaimName, MountPath: MetadataDir})
		} else if dataVolumeClaim(c) != nil {
			mounts = append(mounts, corev1.VolumeMount{Name: DataClaimName, MountPath: DataDir})
		}
	}

	container := corev1.Container{
		Name:            "chimerad",
		Image:           c.Spec.Image,
		ImagePullPolicy: c.Spec.ImagePullPolicy,
		Command:         command,
		Args:            args,
		Env:             env,
		Ports:           containerPorts(c, component),
		Resources:       withDeviceRequests(c, res, useNVMe),
		VolumeMounts:    mounts,
		SecurityContext: securityContext(c, useNVMe),
		LivenessProbe:   probe(component, "/healthz", 10, livenessFailures),
		ReadinessProbe:  probe(component, "/readyz", 5, readinessFailures),
	}
	if component == ComponentDS {
		// The DS serves no admin API: ready means the NFS listener accepts.
		container.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("nfs")}}, PeriodSeconds: 5}
	}
	auto := false
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: Labels(c, component), Annotations: annotations},
		Spec: corev1.PodSpec{
			Containers:                   []corev1.Container{container},
			Volumes:                      volumes,
			NodeSelector:                 placement.NodeSelector,
			Tolerations:                  placement.Tolerations,
			Affinity:                     placement.Affinity,
			AutomountServiceAccountToken: &auto,
			// Stop signal → orderly shutdown; DS fencing tolerates the wait.
			TerminationGracePeriodSeconds: ptr64(30),
		},
	}
}

// Probe bounds. A restart of chimerad is not free (a memfs server loses
// every volume; a durable one runs recovery and the NFSv4 grace period), so
// the liveness probe kills only a server that has not answered for a minute
// (6 × 10 s), each try allowed 5 s: a busy or CPU-starved node (seen on the
// e2e's loaded 2-core host, where 1 s timeouts killed a healthy MDS mid-fio)
// is not a dead one. Readiness reacts sooner: it only takes the pod out of
// the Service.
const (
	probeTimeoutS     = 5
	livenessFailures  = 6
	readinessFailures = 3
)

func probe(component, path string, periodS, failures int32) *corev1.Probe {
	// The MDS's admin port speaks HTTPS (the kubelet does not verify
	// probe certificates).
	port, scheme := "admin", corev1.URISchemeHTTPS
	if component == ComponentDS {
		port, scheme = "metrics", corev1.URISchemeHTTP // the DS answers /healthz on its metrics port
	}
	return &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString(port), Scheme: scheme}},
		PeriodSeconds:    periodS,
		TimeoutSeconds:   probeTimeoutS,
		FailureThreshold: failures,
	}
}

// securityContext grants only what the data path needs: IPC_LOCK to pin
// buffer pools (hugepages, RDMA memory registration), NET_BIND_SERVICE for
// port 2049, SYS_RAWIO for VFIO device access. Binding NVMe by PCI address
// or block devices by path without a device plugin means the device cgroup
// must allow /dev/vfio/* or the block devices, which only a privileged
// container gets.
func securityContext(c *chimerav1.ChimeraCluster, useNVMe bool) *corev1.SecurityContext {
	caps := []corev1.Capability{"IPC_LOCK", "NET_BIND_SERVICE"}
	if n := c.Spec.Storage.NVMe; useNVMe && (len(n.PCIAddresses) > 0 || n.ResourceName != "") {
		caps = append(caps, "SYS_RAWIO") // VFIO; block devices and image files through io_uring need none
	}
	f, ro := false, true
	sc := &corev1.SecurityContext{
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: caps},
		AllowPrivilegeEscalation: &f,
		ReadOnlyRootFilesystem:   &ro,
	}
	if n := c.Spec.Storage.NVMe; useNVMe && (len(n.PCIAddresses) > 0 || len(n.DevicePaths) > 0) {
		t := true
		sc.Privileged = &t
		sc.AllowPrivilegeEscalation = nil // privileged implies escalation; the API rejects false with it
	}
	return sc
}

// hugePageMedium returns the emptyDir medium for the hugepage size the pod
// requests (tuning.hugePageSize, else the first hugepages-* resource).
func hugePageMedium(c *chimerav1.ChimeraCluster, res corev1.ResourceRequirements) corev1.StorageMedium {
	switch c.Spec.Tuning.HugePageSize {
	case "1Gi":
		return "HugePages-1Gi"
	case "2Mi":
		return "HugePages-2Mi"
	}
	var names []string
	for n := range res.Limits {
		names = append(names, string(n))
	}
	for n := range res.Requests {
		names = append(names, string(n))
	}
	sort.Strings(names)
	for _, n := range names {
		if n == "hugepages-1Gi" {
			return "HugePages-1Gi"
		}
		if n == "hugepages-2Mi" {
			return "HugePages-2Mi"
		}
	}
	return ""
}

// withDeviceRequests adds the device-plugin resources (NVMe, RDMA) to the
// user's requirements. Extended resources must have request == limit.
func withDeviceRequests(c *chimerav1.ChimeraCluster, res corev1.ResourceRequirements, useNVMe bool) corev1.ResourceRequirements {
	out := *res.DeepCopy()
	add := func(name string, count int64) {
		if out.Limits == nil {
			out.Limits = corev1.ResourceList{}
		}
		if out.Requests == nil {
			out.Requests = corev1.ResourceList{}
		}
		q := *resource.NewQuantity(count, resource.DecimalSI)
		out.Limits[corev1.ResourceName(name)] = q
		out.Requests[corev1.ResourceName(name)] = q
	}
	if useNVMe && c.Spec.Storage.NVMe.ResourceName != "" {
		add(c.Spec.Storage.NVMe.ResourceName, int64(max(c.Spec.Storage.NVMe.DevicesPerPod, 1)))
	}
	if c.Spec.Network.RDMAResourceName != "" {
		add(c.Spec.Network.RDMAResourceName, 1)
	}
	return out
}

func ptr64(v int64) *int64 { return &v }

func ptrQuantity(q resource.Quantity) *resource.Quantity { return &q }

// String names a child for events and errors ("StatefulSet ns/name").
func String(o client.Object, kind string) string {
	return fmt.Sprintf("%s %s/%s", kind, o.GetNamespace(), o.GetName())
}
