package controller

// The rolling update. A new revision (render.Revision: spec.image and the
// rendered config) changes the server pods' templates, whose update strategy
// is OnDelete: nothing restarts until this code deletes a pod. It brings
// one pod at a time to the revision, data servers first in ordinal order and
// the MDS last:
//
//	DS:  Drain (pushed draining; wait until no layout names it)
//	     → Restart (delete the pod) → WaitReady (new pod ready at the
//	     revision, the MDS sees it ready and healthy) → Undrain (pushed
//	     not draining) → Resync (wait until the MDS reports no stale
//	     mirror copy on any DS: the copies that missed writes while the DS
//	     was away are back in step, so the next DS to go does not take the
//	     last good copy of a file with it) → next
//	MDS: Restart → WaitReady (ready, admin API answers, its NFSv4 grace
//	     period over: clients have reclaimed their state); never on memfs
//	     without spec.rollout.allowMemfsMetadataServerRestart
//
// The state lives in status.rollout, so each reconcile (pod events and a
// short requeue while rolling) moves at most one step and a restarted
// operator carries on where the last one stopped. A step past its timeout,
// or a drain the MDS refuses, stops the rollout (status.rollout.failure,
// UpToDate=False/RolloutFailed naming the step and the pod) until the
// revision changes, or the failed pod turns ready at the revision by itself.

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/render"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// RolloutPollInterval is the requeue while a rollout moves: drains and
	// readiness at the MDS are polled (pod events come by watch anyway).
	RolloutPollInterval = 2 * time.Second
	// Defaults of spec.rollout's timeouts (the CRD defaults them too).
	defaultPodReadyTimeout = 600 * time.Second
	defaultDrainTimeout    = 300 * time.Second
	defaultResyncTimeout   = 1800 * time.Second
)

// rollout is one reconcile's view of the rolling update.
type rollout struct {
	st    *chimerav1.RolloutStatus
	ds    []*corev1.Pod // DS pods in rollout order
	mds   *corev1.Pod   // nil when absent
	now   time.Time
	event func(kind, reason, msg string)
}

// draining names the DS the MDS must treat as draining ("" for none): the
// pod of a DS step before Undrain, also after its Restart or WaitReady failed
// (a DS whose replacement went wrong takes no layouts until a human looks).
// A failed Drain is undone: the pod was not touched, and a drain the MDS
// refuses would fail every later push of the list.
func (ro *rollout) draining() string {
	if ro == nil || ro.st.Pod == "" || ro.isMDS(ro.st.Pod) {
		return ""
	}
	switch ro.st.Step {
	case chimerav1.RolloutStepDrain:
		if ro.st.Failure != "" {
			return ""
		}
		return ro.st.Pod
	case chimerav1.RolloutStepRestart, chimerav1.RolloutStepWaitReady:
		return ro.st.Pod
	}
	return ""
}

func (ro *rollout) isMDS(name string) bool { return ro.mds != nil && ro.mds.Name == name }

func (ro *rollout) moving() bool { return ro != nil && ro.st.Pod != "" && ro.st.Failure == "" }

func (ro *rollout) pod(name string) *corev1.Pod {
	if ro.isMDS(name) {
		return ro.mds
	}
	for _, p := range ro.ds {
		if p.Name == name {
			return p
		}
	}
	return nil
}

func atRevision(p *corev1.Pod, rev string) bool {
	return p != nil && p.DeletionTimestamp == nil && p.Annotations[render.AnnotationRevision] == rev
}

// podOrder sorts pods by name, a trailing "-<ordinal>" numerically (ds-2
// before ds-10).
func podOrder(pods []*corev1.Pod) {
	key := func(n string) (string, int) {
		i := strings.LastIndexByte(n, '-')
		if i < 0 {
			return n, -1
		}
		v, err := strconv.Atoi(n[i+1:])
		if err != nil {
			return n, -1
		}
		return n[:i], v
	}
	sort.Slice(pods, func(i, j int) bool {
		pi, oi := key(pods[i].Name)
		pj, oj := key(pods[j].Name)
		if pi != pj {
			return pi < pj
		}
		return oi < oj
	})
}

// fail stops the rollout at its current step.
func (ro *rollout) fail(format string, args ...any) {
	ro.st.Failure = fmt.Sprintf("step %s of pod %s failed: ", ro.st.Step, ro.st.Pod) + fmt.Sprintf(format, args...)
	ro.event(corev1.EventTypeWarning, render.ReasonRolloutFailed, ro.st.Failure)
}

func (ro *rollout) enter(step chimerav1.RolloutStep) {
	ro.st.Step = step
	t := metav1.NewTime(ro.now)
	ro.st.StepStartTime = &t
}

func (ro *rollout) elapsed() time.Duration {
	if ro.st.StepStartTime == nil {
		return 0
	}
	return ro.now.Sub(ro.st.StepStartTime.Time)
}

func timeouts(c *chimerav1.ChimeraCluster) (ready, drain, resync time.Duration) {
	ready, drain, resync = defaultPodReadyTimeout, defaultDrainTimeout, defaultResyncTimeout
	if s := c.Spec.Rollout.PodReadyTimeoutSeconds; s > 0 {
		ready = time.Duration(s) * time.Second
	}
	if s := c.Spec.Rollout.DrainTimeoutSeconds; s > 0 {
		drain = time.Duration(s) * time.Second
	}
	if s := c.Spec.Rollout.ResyncTimeoutSeconds; s > 0 {
		resync = time.Duration(s) * time.Second
	}
	return ready, drain, resync
}

// planRollout reads the pods and the last status and moves the rollout one
// step when it can. It runs before the DS list is pushed (so a drain it
// starts goes out in the same reconcile) and may delete one pod.
func (r *Reconciler) planRollout(ctx context.Context, c *chimerav1.ChimeraCluster, rev string, auth adminAuth, obs *render.Observed) (*rollout, error) {
	ro := &rollout{now: time.Now(), event: func(kind, reason, msg string) { r.Recorder.Event(c, kind, reason, msg) }}
	if prev := c.Status.Rollout; prev != nil && prev.Revision == rev {
		ro.st = prev.DeepCopy()
	} else {
		ro.st = &chimerav1.RolloutStatus{Revision: rev}
	}
	for i := range obs.DSPods {
		ro.ds = append(ro.ds, &obs.DSPods[i])
	}
	podOrder(ro.ds)
	mds := &corev1.Pod{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: render.MDSName(c) + "-0"}, mds)
	switch {
	case err == nil:
		ro.mds = mds
	case !apierrors.IsNotFound(err):
		return nil, err
	}
	obs.Rollout = ro.st
	defer func() { obs.RolloutPending = ro.count() }()

	if ro.st.Failure != "" {
		// A pod that failed WaitReady and is ready at the revision now
		// (the node came back, an image pull finally worked) resumes.
		p := ro.pod(ro.st.Pod)
		if ro.st.Step != chimerav1.RolloutStepWaitReady || !atRevision(p, rev) || !render.PodReady(p) {
			return ro, nil
		}
		ro.event(corev1.EventTypeNormal, "RolloutResumed", fmt.Sprintf("pod %s is ready at revision %s: rollout resumes", p.Name, rev))
		ro.st.Failure = ""
		ro.enter(chimerav1.RolloutStepWaitReady)
	}
	if ro.st.Pod == "" {
		if !r.pickNext(c, ro, obs) {
			return ro, nil
		}
		if ro.st.Step == chimerav1.RolloutStepDrain {
			return ro, nil // the drain goes out with this reconcile's push; checked next time
		}
	}
	return ro, r.step(ctx, c, ro, auth)
}

// count refreshes the progress counters and reports whether an existing
// server pod is not at the revision.
func (ro *rollout) count() bool {
	ro.st.DataServers = int32(len(ro.ds))
	ro.st.DataServersUpdated = 0
	for _, p := range ro.ds {
		if atRevision(p, ro.st.Revision) {
			ro.st.DataServersUpdated++
		}
	}
	ro.st.MetadataServerUpdated = atRevision(ro.mds, ro.st.Revision)
	return ro.st.DataServersUpdated < ro.st.DataServers || (ro.mds != nil && !ro.st.MetadataServerUpdated)
}

// pickNext chooses the next pod to replace, if any may go now: the first
// out-of-date DS in order while every other server is ready, then the MDS.
func (r *Reconciler) pickNext(c *chimerav1.ChimeraCluster, ro *rollout, obs *render.Observed) bool {
	rev := ro.st.Revision
	var next *corev1.Pod
	for _, p := range ro.ds {
		if p.DeletionTimestamp == nil && !atRevision(p, rev) {
			next = p
			break
		}
	}
	mdsOld := ro.mds != nil && ro.mds.DeletionTimestamp == nil && !atRevision(ro.mds, rev)
	if next == nil && !mdsOld {
		return false // every existing pod runs rev; absent pods come from the new template
	}
	var notReady []string
	if ro.mds == nil || !render.PodReady(ro.mds) {
		if next != nil { // the MDS drains the DS: it must be up
			notReady = append(notReady, render.MDSName(c)+"-0")
		}
	}
	for _, p := range ro.ds {
		if p != next && !render.PodReady(p) {
			notReady = append(notReady, p.Name)
		}
	}
	if int32(len(ro.ds)) < obs.DSDesired {
		notReady = append(notReady, fmt.Sprintf("%d data-server pods missing", obs.DSDesired-int32(len(ro.ds))))
	}
	if len(notReady) > 0 {
		obs.RolloutWaiting = "waiting for every other server to be ready before replacing the next (not ready: " + strings.Join(notReady, ", ") + ")"
		return false
	}
	if next == nil {
		if c.Spec.Storage.Backend != chimerav1.BackendNVMe && !c.Spec.Rollout.AllowMemfsMetadataServerRestart {
			obs.MDSRestartRefused = true
			if cond := findCondition(c, chimerav1.ConditionUpToDate); cond == nil || cond.Reason != render.ReasonMetadataServerRestartRefused {
				ro.event(corev1.EventTypeWarning, render.ReasonMetadataServerRestartRefused, fmt.Sprintf(
					"not restarting MDS pod %s for revision %s: its memfs backend would lose every file; set spec.rollout.allowMemfsMetadataServerRestart to allow it",
					ro.mds.Name, rev))
			}
			return false
		}
		next = ro.mds
	}
	ro.st.Pod = next.Name
	ro.st.PodUID = string(next.UID)
	ro.st.Failure = ""
	if next == ro.mds {
		ro.enter(chimerav1.RolloutStepRestart)
	} else {
		ro.enter(chimerav1.RolloutStepDrain)
	}
	ro.event(corev1.EventTypeNormal, "RolloutStep", fmt.Sprintf("replacing pod %s for revision %s: %s", next.Name, rev, ro.st.Step))
	return true
}

// step runs the current step of ro.st.Pod as far as it can go now.
func (r *Reconciler) step(ctx context.Context, c *chimerav1.ChimeraCluster, ro *rollout, auth adminAuth) error {
	readyTimeout, drainTimeout, resyncTimeout := timeouts(c)
	name := ro.st.Pod
	switch ro.st.Step {
	case chimerav1.RolloutStepDrain:
		done, why := r.drained(ctx, c, ro, auth)
		if !done {
			if ro.elapsed() > drainTimeout {
				ro.fail("not drained within %v: %s", drainTimeout, why)
			}
			return nil
		}
		ro.enter(chimerav1.RolloutStepRestart)
		fallthrough
	case chimerav1.RolloutStepRestart:
		p := ro.pod(name)
		if p == nil || string(p.UID) != ro.st.PodUID {
			ro.enter(chimerav1.RolloutStepWaitReady) // already gone (a retried delete)
			return nil
		}
		uid := p.UID
		err := r.Client.Delete(ctx, p, client.Preconditions{UID: &uid})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("rollout: delete pod %s: %w", name, err)
		}
		ro.event(corev1.EventTypeNormal, "RolloutStep", fmt.Sprintf("deleted pod %s for revision %s", name, ro.st.Revision))
		ro.enter(chimerav1.RolloutStepWaitReady)
		return nil
	case chimerav1.RolloutStepWaitReady:
		ok, why := r.replaced(ctx, c, ro, auth)
		if !ok {
			if ro.elapsed() > readyTimeout {
				ro.fail("not ready within %v: %s", readyTimeout, why)
			}
			return nil
		}
		if ro.isMDS(name) {
			ro.done()
			return nil
		}
		ro.enter(chimerav1.RolloutStepUndrain) // pushed after this; finishRollout moves it to Resync
	case chimerav1.RolloutStepResync:
		done, why := r.resynced(ctx, c, ro, auth)
		if !done {
			if ro.elapsed() > resyncTimeout {
				ro.fail("mirror copies not resynced within %v: %s", resyncTimeout, why)
			}
			return nil
		}
		ro.done()
	}
	return nil
}

// resynced: no data server holds a stale mirror copy. Every DS counts, not
// only the one just back: the next DS to drain may hold the only good copy
// of a file whose other copy went stale for any reason. An MDS that
// predates staleCopies (not rolled yet) has no resync to wait for.
func (r *Reconciler) resynced(ctx context.Context, c *chimerav1.ChimeraCluster, ro *rollout, auth adminAuth) (bool, string) {
	if ro.mds == nil || ro.mds.Status.PodIP == "" {
		return false, "no MDS pod to ask"
	}
	states, err := r.Admin.DataServerStates(ctx, AdminServer{URL: r.AdminURL(c, ro.mds), Name: render.MDSAdminServerName(c), Token: auth.Token, CAPEM: auth.CAPEM})
	if err != nil {
		return false, err.Error()
	}
	var stale []string
	for name, s := range states {
		if s.StaleCopies != nil && *s.StaleCopies > 0 {
			stale = append(stale, fmt.Sprintf("%s: %d", name, *s.StaleCopies))
		}
	}
	if len(stale) > 0 {
		sort.Strings(stale)
		return false, "stale mirror copies at the MDS (" + strings.Join(stale, ", ") + ")"
	}
	return true, ""
}

// drained: the MDS lists the DS as draining and no layout names it. An MDS
// that predates layoutsHeld (not rolled yet: it goes last) is taken at its
// word once it reports draining, since it recalled the layouts then.
func (r *Reconciler) drained(ctx context.Context, c *chimerav1.ChimeraCluster, ro *rollout, auth adminAuth) (bool, string) {
	if ro.mds == nil || ro.mds.Status.PodIP == "" {
		return false, "no MDS pod to ask"
	}
	states, err := r.Admin.DataServerStates(ctx, AdminServer{URL: r.AdminURL(c, ro.mds), Name: render.MDSAdminServerName(c), Token: auth.Token, CAPEM: auth.CAPEM})
	if err != nil {
		return false, err.Error()
	}
	s, ok := states[ro.st.Pod]
	switch {
	case !ok:
		if p := ro.pod(ro.st.Pod); p == nil || !render.PodReady(p) {
			return true, "" // not listed (no address, not running): nothing to drain
		}
		return false, "the MDS does not list it"
	case !s.Draining:
		return false, "the MDS does not report it draining yet"
	case s.LayoutsHeld != nil && *s.LayoutsHeld > 0:
		return false, fmt.Sprintf("%d layouts still name it", *s.LayoutsHeld)
	}
	return true, ""
}

// replaced: the pod was recreated (another UID) at the revision and is
// ready; a DS is also ready and healthy at the MDS, the MDS's admin API
// answers.
func (r *Reconciler) replaced(ctx context.Context, c *chimerav1.ChimeraCluster, ro *rollout, auth adminAuth) (bool, string) {
	p := ro.pod(ro.st.Pod)
	switch {
	case p == nil:
		return false, "no new pod yet"
	case string(p.UID) == ro.st.PodUID:
		return false, "the old pod is still there"
	case !render.PodReady(p):
		return false, "the new pod is not ready"
	}
	if ro.mds == nil || ro.mds.Status.PodIP == "" {
		return false, "no MDS pod to ask"
	}
	states, err := r.Admin.DataServerStates(ctx, AdminServer{URL: r.AdminURL(c, ro.mds), Name: render.MDSAdminServerName(c), Token: auth.Token, CAPEM: auth.CAPEM})
	if err != nil {
		return false, "the MDS admin API: " + err.Error()
	}
	if ro.isMDS(p.Name) {
		// Moving on during grace would restart nothing more, but the
		// rollout reports done only once clients can open files again.
		left, err := r.Admin.GraceRemaining(ctx, AdminServer{URL: r.AdminURL(c, ro.mds), Name: render.MDSAdminServerName(c), Token: auth.Token, CAPEM: auth.CAPEM})
		switch {
		case err != nil:
			return false, "the MDS admin API: " + err.Error()
		case left != nil && *left > 0:
			return false, fmt.Sprintf("the MDS is in its NFSv4 grace period (%v left): clients reclaim their state", left.Round(time.Second))
		}
		return true, ""
	}
	s, ok := states[p.Name]
	switch {
	case !ok:
		return false, "the MDS does not list it yet"
	case !s.Ready:
		return false, "the MDS does not see it ready yet"
	case !s.Healthy:
		return false, "the MDS reports it unhealthy"
	}
	return true, ""
}

func (ro *rollout) done() {
	ro.event(corev1.EventTypeNormal, "RolloutStep", fmt.Sprintf("pod %s runs revision %s", ro.st.Pod, ro.st.Revision))
	ro.st.Pod, ro.st.PodUID, ro.st.Step, ro.st.StepStartTime = "", "", "", nil
}

// finishRollout runs after the push: a drain the MDS refused stops the
// rollout; an undrain it took completes the DS.
func (ro *rollout) finishRollout(obs *render.Observed) {
	if !ro.moving() || ro.isMDS(ro.st.Pod) {
		return
	}
	switch ro.st.Step {
	case chimerav1.RolloutStepDrain:
		if obs.PushErr != nil {
			ro.fail("the MDS refused the drain: %v", obs.PushErr)
		}
	case chimerav1.RolloutStepUndrain:
		if obs.PushErr != nil {
			ro.fail("the MDS refused the undrain: %v", obs.PushErr)
			return
		}
		if obs.DSListInSync {
			ro.enter(chimerav1.RolloutStepResync)
		}
	}
}

func findCondition(c *chimerav1.ChimeraCluster, t string) *metav1.Condition {
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == t {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}
