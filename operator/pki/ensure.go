package pki

import (
	"bytes"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CACommonName is the subject of the admin CA.
const CACommonName = "chimera-admin-ca"

// EnsureCA returns the admin CA kept in Secret namespace/name (ca.crt,
// ca.key), generating it when the Secret is missing, empty, damaged or the
// CA is about to expire, and keeps ConfigMap namespace/name holding ca.crt
// alone: the bundle the CSI controller mounts to verify admin servers. The
// chart creates both objects empty (so uninstalling removes them); they are
// created here when missing (an operator run outside the chart).
func EnsureCA(ctx context.Context, c client.Client, namespace, name string, now time.Time) (*CA, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	sec := &corev1.Secret{}
	err := c.Get(ctx, key, sec)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("get admin CA secret %s: %w", key, err)
	}
	ca, perr := ParseCA(sec.Data[KeyCACert], sec.Data[KeyCAKey])
	if perr != nil || !ca.UsableAt(now) {
		if ca, err = NewCA(CACommonName, now); err != nil {
			return nil, err
		}
		sec.Namespace, sec.Name = namespace, name
		if sec.Type == "" {
			sec.Type = corev1.SecretTypeOpaque
		}
		sec.Data = map[string][]byte{KeyCACert: ca.CertPEM, KeyCAKey: ca.KeyPEM}
		if exists {
			err = c.Update(ctx, sec)
		} else {
			err = c.Create(ctx, sec)
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			// Another replica wrote it first: use theirs.
			return EnsureCA(ctx, c, namespace, name, now)
		}
		if err != nil {
			return nil, fmt.Errorf("write admin CA secret %s: %w", key, err)
		}
	}
	cm := &corev1.ConfigMap{}
	err = c.Get(ctx, key, cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Data: map[string]string{KeyCACert: string(ca.CertPEM)}}
		if err := c.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create admin CA bundle configmap %s: %w", key, err)
		}
	case err != nil:
		return nil, fmt.Errorf("get admin CA bundle configmap %s: %w", key, err)
	case !bytes.Equal([]byte(cm.Data[KeyCACert]), ca.CertPEM):
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[KeyCACert] = string(ca.CertPEM)
		if err := c.Update(ctx, cm); err != nil {
			return nil, fmt.Errorf("update admin CA bundle configmap %s: %w", key, err)
		}
	}
	return ca, nil
}
