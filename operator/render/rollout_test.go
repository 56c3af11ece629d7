package render

import (
	"testing"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Proves the rollout's inputs: one revision names image + rendered config and
// is on both pod templates; it follows the image and config fields but not the
// export client rules; no workload restarts pods by itself (OnDelete); the
// pushed DS list marks only the draining DS; UpToDate says what the rollout
// does.
func TestRevisionFollowsImageAndConfigOnly(t *testing.T) {
	c := smallCluster()
	one, _ := ExportAccess(c, []string{"10.0.0.1"})
	two, _ := ExportAccess(c, []string{"10.0.0.1", "10.0.0.2"})
	a, err := Build(c, one)
	if err != nil {
		t.Fatal(err)
	}
	if a.Revision == "" || a.MDS.Spec.Template.Annotations[AnnotationRevision] != a.Revision ||
		a.DSStatefulSet.Spec.Template.Annotations[AnnotationRevision] != a.Revision {
		t.Fatalf("revision %q not on both templates: %v / %v", a.Revision, a.MDS.Spec.Template.Annotations, a.DSStatefulSet.Spec.Template.Annotations)
	}
	if a.MDS.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType || a.DSStatefulSet.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Fatalf("StatefulSets must be OnDelete (the operator replaces pods): %v %v", a.MDS.Spec.UpdateStrategy, a.DSStatefulSet.Spec.UpdateStrategy)
	}
	if b, _ := Build(c, two); b.Revision != a.Revision {
		t.Error("a node joining changed the revision: every server would be replaced")
	}
	img := smallCluster()
	img.Spec.Image = "localhost/chimera/chimerad:v2"
	if b, _ := Build(img, one); b.Revision == a.Revision {
		t.Error("an image change kept the revision")
	}
	cfg := smallCluster()
	cfg.Spec.PNFS.StripeUnitBytes = 2 << 20
	if b, _ := Build(cfg, one); b.Revision == a.Revision {
		t.Error("a rendered config change kept the revision")
	}
	ds := smallCluster()
	ds.Spec.DataServers.Mode = chimerav1.DataServerModeDaemonSet
	ds.Spec.DataServers.Count = nil
	d, _ := Build(ds, one)
	if d.DSDaemonSet.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType || d.DSDaemonSet.Spec.Template.Annotations[AnnotationRevision] != d.Revision {
		t.Fatalf("DaemonSet must be OnDelete and carry the revision: %+v", d.DSDaemonSet.Spec)
	}
}

func TestDSListMarksOnlyTheDrainingDS(t *testing.T) {
	c := smallCluster()
	st := []chimerav1.DataServerStatus{{Pod: "a-ds-0", StorageAddress: "10.0.0.1", Ready: true}, {Pod: "a-ds-1", StorageAddress: "10.0.0.2", Ready: true}}
	for _, e := range DSList(c, st, "") {
		if e.Draining {
			t.Fatalf("nothing drains: %+v", e)
		}
	}
	l := DSList(c, st, "a-ds-1")
	if l[0].Draining || !l[1].Draining {
		t.Fatalf("only a-ds-1 drains: %+v", l)
	}
}

func TestUpToDateCondition(t *testing.T) {
	c := smallCluster()
	now := metav1.Now()
	cond := func(o Observed) metav1.Condition {
		st := Status(c, o, now)
		for _, x := range st.Conditions {
			if x.Type == chimerav1.ConditionUpToDate {
				return x
			}
		}
		t.Fatalf("no UpToDate condition: %+v", st.Conditions)
		return metav1.Condition{}
	}
	r := &chimerav1.RolloutStatus{Revision: "abc", DataServers: 2, DataServersUpdated: 1, Pod: "a-ds-1", Step: chimerav1.RolloutStepDrain}
	if x := cond(Observed{Rollout: r}); x.Reason != ReasonRollingOut || x.Status != metav1.ConditionFalse || x.Message != "rolling to revision abc: pod a-ds-1: step Drain (1/2 data servers updated, MDS updated: false)" {
		t.Fatalf("rolling: %+v", x)
	}
	r.Failure = "step WaitReady of pod a-ds-1 failed: not ready within 3s"
	if x := cond(Observed{Rollout: r}); x.Reason != ReasonRolloutFailed || x.Message != r.Failure {
		t.Fatalf("failed: %+v", x)
	}
	done := &chimerav1.RolloutStatus{Revision: "abc", DataServers: 2, DataServersUpdated: 2}
	if x := cond(Observed{Rollout: done, MDSRestartRefused: true}); x.Reason != ReasonMetadataServerRestartRefused {
		t.Fatalf("memfs MDS: %+v", x)
	}
	done.MetadataServerUpdated = true
	if x := cond(Observed{Rollout: done}); x.Reason != ReasonAllPodsAtRevision || x.Status != metav1.ConditionTrue {
		t.Fatalf("done: %+v", x)
	}
	if st := Status(c, Observed{}, now); st.Rollout != nil || len(st.Conditions) != 3 {
		t.Fatalf("no rollout observed: status keeps what it had: %+v", st)
	}
}
