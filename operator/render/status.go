package render

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NetworkStatusBytesMax bounds the annotation we parse: it is written by a CNI
// plugin, but a user can edit pod annotations too.
const NetworkStatusBytesMax = 64 << 10

// networkStatusEntry is one element of Multus' network-status annotation.
type networkStatusEntry struct {
	Name      string   `json:"name"`
	Interface string   `json:"interface"`
	IPs       []string `json:"ips"`
	Default   bool     `json:"default"`
}

// StorageAddress returns the address clients should use for a DS pod: the
// first IP of the storage-network attachment named nad (as Multus reports it
// in the network-status annotation), or the pod IP without Multus. An
// annotation that is present but unusable is an error naming the problem.
func StorageAddress(pod *corev1.Pod, nad, namespace string) (string, error) {
	if nad == "" {
		return pod.Status.PodIP, nil
	}
	raw, ok := pod.Annotations[AnnotationNetworkStatus]
	if !ok {
		return "", fmt.Errorf("pod %s: no %s annotation yet (is Multus installed?)", pod.Name, AnnotationNetworkStatus)
	}
	if len(raw) > NetworkStatusBytesMax {
		return "", fmt.Errorf("pod %s: %s annotation is %d bytes, more than %d", pod.Name, AnnotationNetworkStatus, len(raw), NetworkStatusBytesMax)
	}
	var entries []networkStatusEntry
	if err := json.Unmarshal([]byte(raw), &entries); err != nil {
		return "", fmt.Errorf("pod %s: %s annotation is not a JSON list: %v", pod.Name, AnnotationNetworkStatus, err)
	}
	want := nad
	if !strings.Contains(want, "/") {
		want = namespace + "/" + nad
	}
	for _, e := range entries {
		if (e.Name == want || e.Name == nad) && len(e.IPs) > 0 {
			return e.IPs[0], nil
		}
	}
	return "", fmt.Errorf("pod %s: %s annotation has no IP for network %q", pod.Name, AnnotationNetworkStatus, want)
}

// PodReady reports the pod's Ready condition.
func PodReady(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// DataServerStatuses turns the DS pods into status entries, sorted by pod
// name, with the problems (unusable annotations) that make them unusable.
func DataServerStatuses(c *chimerav1.ChimeraCluster, pods []corev1.Pod) ([]chimerav1.DataServerStatus, []string) {
	var out []chimerav1.DataServerStatus
	var problems []string
	for i := range pods {
		p := &pods[i]
		addr, err := StorageAddress(p, c.Spec.Network.NetworkAttachment, c.Namespace)
		if err != nil {
			problems = append(problems, err.Error())
		}
		out = append(out, chimerav1.DataServerStatus{Pod: p.Name, Node: p.Spec.NodeName, StorageAddress: addr, Ready: PodReady(p) && addr != ""})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pod < out[j].Pod })
	sort.Strings(problems)
	if len(out) > chimerav1.DataServersMax {
		problems = append(problems, fmt.Sprintf("%d DS pods, status lists the first %d", len(out), chimerav1.DataServersMax))
		out = out[:chimerav1.DataServersMax]
	}
	return out, problems
}

// DSListEntry is one element of the admin API's PUT /api/v1/dataservers body.
type DSListEntry struct {
	Name      string `json:"name"`
	Address   string `json:"address"`
	Port      int32  `json:"port"`
	Transport string `json:"transport"`
	Ready     bool   `json:"ready"`
	Node      string `json:"node,omitempty"`
	// Draining: the MDS recalls the layouts naming the DS and grants none.
	Draining bool `json:"draining,omitempty"`
}

// DSList is the body pushed to the MDS: every DS that has a storage address;
// the one named draining (the rollout's, "" for none) is marked so.
func DSList(c *chimerav1.ChimeraCluster, ds []chimerav1.DataServerStatus, draining string) []DSListEntry {
	out := []DSListEntry{}
	for _, d := range ds {
		if d.StorageAddress == "" {
			continue
		}
		out = append(out, DSListEntry{Name: d.Pod, Address: d.StorageAddress, Port: ClientPort(c), Transport: string(Transport(c)),
			Ready: d.Ready, Node: d.Node, Draining: draining != "" && d.Pod == draining})
	}
	return out
}

// Observed is what the reconciler saw of the children.
type Observed struct {
	MDSReady     bool
	DSPods       []corev1.Pod
	DSDesired    int32 // from the StatefulSet spec or the DaemonSet's status
	PushErr      error // last PUT /api/v1/dataservers error, nil when pushed
	AccessErr    error // last PUT /api/v1/access/<mount> error, nil when pushed
	ApplyErr     error
	DSListInSync bool
	// Rollout is the rolling update's progress (nil: not computed, status
	// keeps what it had).
	Rollout *chimerav1.RolloutStatus
	// RolloutWaiting says why the next pod is not replaced yet ("" when it is
	// or nothing is left).
	RolloutWaiting string
	// RolloutPending: some existing server pod does not run the revision.
	RolloutPending bool
	// MDSRestartRefused: only the MDS is left to roll and its backend is
	// memfs without spec.rollout.allowMemfsMetadataServerRestart.
	MDSRestartRefused bool
	// AdminTLS is the state of the MDS's admin certificate (the
	// AdminTLSReady condition; a zero value leaves the condition as it was).
	AdminTLS AdminTLSState
}

// AdminTLSState: whether the admin TLS Secret can serve the MDS, and why not.
type AdminTLSState struct {
	Ready   bool
	Reason  string
	Message string
}

// Reasons of the AdminTLSReady condition.
const (
	ReasonSelfManagedCA           = "SelfManagedCA"
	ReasonCertificateIssued       = "CertificateIssued"
	ReasonWaitingForCertificate   = "WaitingForCertificate"
	ReasonCertManagerNotInstalled = "CertManagerNotInstalled"
)

// Status computes the status from what was observed. now is passed in so
// the function stays pure (conditions carry transition times).
func Status(c *chimerav1.ChimeraCluster, o Observed, now metav1.Time) chimerav1.ChimeraClusterStatus {
	st := *c.Status.DeepCopy()
	st.ObservedGeneration = c.Generation
	st.MetadataServerEndpoint = MDSEndpoint(c)
	ds, problems := DataServerStatuses(c, o.DSPods)
	st.DataServers = ds
	st.DataServersDesired = o.DSDesired
	st.DataServersReady = 0
	for _, d := range ds {
		if d.Ready {
			st.DataServersReady++
		}
	}
	mirrors := orDefault32(c.Spec.PNFS.Mirrors, 1)

	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: c.Generation, LastTransitionTime: now})
	}
	allReady := o.MDSReady && st.DataServersReady == o.DSDesired && o.DSDesired > 0 && o.DSListInSync
	usable := o.MDSReady && st.DataServersReady >= mirrors && o.DSListInSync

	rolling := o.Rollout != nil && o.Rollout.Failure == "" && !o.MDSRestartRefused && (o.Rollout.Pod != "" || o.RolloutWaiting != "" || o.RolloutPending)
	tlsWaiting := o.AdminTLS.Reason != "" && !o.AdminTLS.Ready
	if o.AdminTLS.Reason != "" {
		s := metav1.ConditionFalse
		if o.AdminTLS.Ready {
			s = metav1.ConditionTrue
		}
		set(chimerav1.ConditionAdminTLSReady, s, o.AdminTLS.Reason, truncate(o.AdminTLS.Message, 1024))
	}
	switch {
	case o.ApplyErr != nil:
		set(chimerav1.ConditionProgressing, metav1.ConditionFalse, "ApplyFailed", o.ApplyErr.Error())
	case tlsWaiting && o.AdminTLS.Reason == ReasonCertManagerNotInstalled:
		set(chimerav1.ConditionProgressing, metav1.ConditionFalse, o.AdminTLS.Reason, truncate(o.AdminTLS.Message, 1024))
	case tlsWaiting:
		set(chimerav1.ConditionProgressing, metav1.ConditionTrue, o.AdminTLS.Reason, truncate(o.AdminTLS.Message, 1024))
	case o.Rollout != nil && o.Rollout.Failure != "":
		set(chimerav1.ConditionProgressing, metav1.ConditionFalse, ReasonRolloutFailed, truncate(o.Rollout.Failure, 1024))
	case rolling:
		set(chimerav1.ConditionProgressing, metav1.ConditionTrue, ReasonRollingOut, rolloutMessage(o))
	case !allReady:
		set(chimerav1.ConditionProgressing, metav1.ConditionTrue, "WaitingForPods", waitingMessage(o, st))
	default:
		set(chimerav1.ConditionProgressing, metav1.ConditionFalse, "ReconcileComplete", "all servers ready and the MDS knows every data server")
	}
	if usable {
		set(chimerav1.ConditionAvailable, metav1.ConditionTrue, "ServersReady", fmt.Sprintf("MDS ready, %d/%d data servers ready", st.DataServersReady, o.DSDesired))
	} else {
		set(chimerav1.ConditionAvailable, metav1.ConditionFalse, "NotEnoughServers", waitingMessage(o, st))
	}
	var degraded []string
	if o.ApplyErr != nil {
		degraded = append(degraded, "apply failed: "+o.ApplyErr.Error())
	}
	if o.PushErr != nil {
		degraded = append(degraded, "pushing the data-server list to the MDS failed: "+o.PushErr.Error())
	}
	if o.AccessErr != nil {
		degraded = append(degraded, "pushing the export client rules to the MDS failed: "+o.AccessErr.Error())
	}
	if tlsWaiting && o.AdminTLS.Reason == ReasonCertManagerNotInstalled {
		degraded = append(degraded, o.AdminTLS.Message)
	}
	degraded = append(degraded, problems...)
	if usable && st.DataServersReady < o.DSDesired {
		degraded = append(degraded, fmt.Sprintf("%d of %d data servers not ready", o.DSDesired-st.DataServersReady, o.DSDesired))
	}
	if len(degraded) > 0 {
		set(chimerav1.ConditionDegraded, metav1.ConditionTrue, degradedReason(o, problems), truncate(strings.Join(degraded, "; "), 1024))
	} else {
		set(chimerav1.ConditionDegraded, metav1.ConditionFalse, "AsExpected", "no problems observed")
	}

	if o.Rollout != nil {
		st.Rollout = o.Rollout.DeepCopy()
		status, reason, msg := upToDate(o)
		set(chimerav1.ConditionUpToDate, status, reason, msg)
	}

	switch {
	case c.DeletionTimestamp != nil:
		st.Phase = chimerav1.PhaseDeleting
	case len(degraded) > 0 && (usable || o.ApplyErr != nil || o.PushErr != nil || o.AccessErr != nil || o.AdminTLS.Reason == ReasonCertManagerNotInstalled):
		st.Phase = chimerav1.PhaseDegraded
	case usable && allReady:
		st.Phase = chimerav1.PhaseAvailable
	case usable:
		st.Phase = chimerav1.PhaseDegraded
	case len(o.DSPods) == 0 && !o.MDSReady:
		st.Phase = chimerav1.PhasePending
	default:
		st.Phase = chimerav1.PhaseProgressing
	}
	return st
}

// Reasons of the UpToDate condition (and of Progressing while rolling).
const (
	ReasonAllPodsAtRevision            = "AllPodsAtRevision"
	ReasonRollingOut                   = "RollingOut"
	ReasonRolloutFailed                = "RolloutFailed"
	ReasonMetadataServerRestartRefused = "MetadataServerRestartRefused"
)

// upToDate is the UpToDate condition for an observed rollout.
func upToDate(o Observed) (metav1.ConditionStatus, string, string) {
	r := o.Rollout
	switch {
	case r.Failure != "":
		return metav1.ConditionFalse, ReasonRolloutFailed, truncate(r.Failure, 1024)
	case o.MDSRestartRefused:
		return metav1.ConditionFalse, ReasonMetadataServerRestartRefused, fmt.Sprintf(
			"data servers run revision %s but the MDS was not restarted: storage.backend memfs keeps every file in the MDS's memory "+
				"and a restart loses them all; set spec.rollout.allowMemfsMetadataServerRestart: true to restart it anyway", r.Revision)
	case r.Pod != "" || o.RolloutWaiting != "" || o.RolloutPending:
		return metav1.ConditionFalse, ReasonRollingOut, rolloutMessage(o)
	}
	return metav1.ConditionTrue, ReasonAllPodsAtRevision, fmt.Sprintf("every server pod runs revision %s", r.Revision)
}

func rolloutMessage(o Observed) string {
	r := o.Rollout
	what := o.RolloutWaiting
	if what == "" {
		what = "between pods"
	}
	if r.Pod != "" {
		what = fmt.Sprintf("pod %s: step %s", r.Pod, r.Step)
	}
	return fmt.Sprintf("rolling to revision %s: %s (%d/%d data servers updated, MDS updated: %t)",
		r.Revision, what, r.DataServersUpdated, r.DataServers, r.MetadataServerUpdated)
}

func waitingMessage(o Observed, st chimerav1.ChimeraClusterStatus) string {
	mds := "not ready"
	if o.MDSReady {
		mds = "ready"
	}
	sync := ""
	if !o.DSListInSync {
		sync = "; data-server list not yet pushed to the MDS"
	}
	return fmt.Sprintf("MDS %s, %d/%d data servers ready%s", mds, st.DataServersReady, o.DSDesired, sync)
}

func degradedReason(o Observed, problems []string) string {
	switch {
	case o.ApplyErr != nil:
		return "ApplyFailed"
	case o.PushErr != nil:
		return "DataServerPushFailed"
	case o.AccessErr != nil:
		return "AccessPushFailed"
	case !o.AdminTLS.Ready && o.AdminTLS.Reason == ReasonCertManagerNotInstalled:
		return ReasonCertManagerNotInstalled
	case len(problems) > 0:
		return "StorageAddressUnknown"
	}
	return "DataServersNotReady"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
