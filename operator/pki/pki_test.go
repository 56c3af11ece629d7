package pki

// Proves the admin CA's life cycle against a fake API server: created (Secret
// and bundle ConfigMap) when missing; the chart's empty objects filled; an
// existing CA kept across operator restarts (so issued certificates stay
// valid); a damaged or expiring one replaced and the bundle updated; and
// that what ParseCA accepts is only a CA whose key matches.

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

const ns, name = "chimera-system", "chimera-admin-ca"

func objects(t *testing.T, c client.Client) (*corev1.Secret, *corev1.ConfigMap) {
	t.Helper()
	sec, cm := &corev1.Secret{}, &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: ns, Name: name}
	if err := c.Get(context.Background(), key, sec); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(context.Background(), key, cm); err != nil {
		t.Fatal(err)
	}
	return sec, cm
}

func TestEnsureCA(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	ctx, now := context.Background(), time.Now()

	// Missing: created.
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	ca, err := EnsureCA(ctx, c, ns, name, now)
	if err != nil {
		t.Fatal(err)
	}
	sec, cm := objects(t, c)
	if string(sec.Data[KeyCACert]) != string(ca.CertPEM) || cm.Data[KeyCACert] != string(ca.CertPEM) || cm.Data[KeyCAKey] != "" {
		t.Fatalf("secret %v / configmap %v: want the CA in both, its key only in the Secret", sec.Data, cm.Data)
	}
	// A restart keeps it.
	again, err := EnsureCA(ctx, c, ns, name, now.Add(time.Hour))
	if err != nil || string(again.CertPEM) != string(ca.CertPEM) {
		t.Fatalf("a second start must keep the CA: %v", err)
	}

	// The chart's empty objects: filled in place.
	meta := metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app.kubernetes.io/instance": "chimera"}}
	c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(&corev1.Secret{ObjectMeta: meta, Type: corev1.SecretTypeOpaque}, &corev1.ConfigMap{ObjectMeta: meta}).Build()
	ca, err = EnsureCA(ctx, c, ns, name, now)
	if err != nil {
		t.Fatal(err)
	}
	sec, cm = objects(t, c)
	if sec.Labels["app.kubernetes.io/instance"] != "chimera" || cm.Data[KeyCACert] != string(ca.CertPEM) {
		t.Fatalf("the chart's objects must be filled, keeping their labels: %+v %+v", sec.ObjectMeta, cm.Data)
	}

	// Damaged, then expiring: replaced, the bundle follows.
	sec.Data[KeyCAKey] = []byte("garbage")
	if err := c.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	fixed, err := EnsureCA(ctx, c, ns, name, now)
	if err != nil || string(fixed.CertPEM) == string(ca.CertPEM) {
		t.Fatalf("a damaged CA must be replaced: %v", err)
	}
	late := now.Add(CAValidity - CARenewBefore/2)
	renewed, err := EnsureCA(ctx, c, ns, name, late)
	if err != nil || string(renewed.CertPEM) == string(fixed.CertPEM) {
		t.Fatalf("a CA inside its renewal window must be replaced: %v", err)
	}
	if _, cm = objects(t, c); cm.Data[KeyCACert] != string(renewed.CertPEM) {
		t.Fatal("the bundle ConfigMap must follow the new CA")
	}

	// ParseCA: a key of another CA, a leaf certificate, garbage.
	other, _ := NewCA("other", now)
	if _, err := ParseCA(ca.CertPEM, other.KeyPEM); err == nil {
		t.Error("a CA with another CA's key must not parse")
	}
	leaf, leafKey, _ := ca.IssueServer([]string{"x.example"}, now)
	if _, err := ParseCA(leaf, leafKey); err == nil {
		t.Error("a server certificate is not a CA")
	}
	if _, err := ParseCA([]byte("nope"), ca.KeyPEM); err == nil {
		t.Error("garbage is not a CA")
	}
}
