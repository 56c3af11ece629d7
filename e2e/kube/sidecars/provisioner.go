package main

// The provisioner stand-in: what external-provisioner does for a CSI driver,
// reduced to what the e2e needs and done by polling (one loop, no informers).
// Fields of the PV follow that sidecar: name pvc-<claim uid>, the
// provisioned-by annotation, the deletion-secret annotations, its finalizer,
// claimRef, the class's reclaim policy and mount options, spec.csi with the
// CreateVolume response's volume id, context and topology.

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
)

const (
	provisionPollInterval = time.Second
	// retryBackoffMax caps the wait between attempts on one claim or volume.
	retryBackoffMax = 30 * time.Second

	annProvisionedBy         = "pv.kubernetes.io/provisioned-by"
	annDeletionSecretName    = "volume.kubernetes.io/provisioner-deletion-secret-name"
	annDeletionSecretNS      = "volume.kubernetes.io/provisioner-deletion-secret-namespace"
	finalizerProvisioner     = "external-provisioner.volume.kubernetes.io/finalizer"
	prefixReserved           = "csi.storage.k8s.io/"
	keyProvisionerSecret     = prefixReserved + "provisioner-secret-name"
	keyProvisionerSecretNS   = prefixReserved + "provisioner-secret-namespace"
	keyFSType                = prefixReserved + "fstype"
	keyPVCName               = prefixReserved + "pvc/name"
	keyPVCNamespace          = prefixReserved + "pvc/namespace"
	keyPVName                = prefixReserved + "pv/name"
	volumeContextIdentityKey = "storage.kubernetes.io/csiProvisionerIdentity"
)

type provisioner struct {
	kube          kubernetes.Interface
	ctrl          csi.ControllerClient
	driver        string
	identity      string
	timeout       time.Duration
	extraMeta     bool
	defaultFSType string
	recorder      record.EventRecorder
	// next attempt per claim/volume uid after a failure, and its backoff.
	retryAt map[string]time.Time
	backoff map[string]time.Duration
}

func runProvisioner(ctx context.Context, csiAddress string, timeout time.Duration, extraMeta bool, defaultFSType string) error {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	conn, err := dialCSI(csiAddress)
	if err != nil {
		return err
	}
	defer conn.Close()
	driver, err := waitForDriver(ctx, conn, timeout)
	if err != nil {
		return err
	}
	bc := record.NewBroadcaster()
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	defer bc.Shutdown()
	p := &provisioner{
		kube: kube, ctrl: csi.NewControllerClient(conn), driver: driver,
		identity: fmt.Sprintf("%d-e2e-%s", time.Now().UnixMilli(), driver),
		timeout:  timeout, extraMeta: extraMeta, defaultFSType: defaultFSType,
		recorder: bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: driver + "_e2e-provisioner"}),
		retryAt:  map[string]time.Time{}, backoff: map[string]time.Duration{},
	}
	log.Printf("provisioner stand-in: provisioning for %s", driver)
	for {
		if err := p.pass(ctx); err != nil {
			log.Printf("provisioner stand-in: %v", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(provisionPollInterval):
		}
	}
}

// due says whether the object may be tried now; failed records a failure.
func (p *provisioner) due(uid string) bool { return time.Now().After(p.retryAt[uid]) }
func (p *provisioner) failed(uid string) {
	b := p.backoff[uid]*2 + time.Second
	if b > retryBackoffMax {
		b = retryBackoffMax
	}
	p.backoff[uid], p.retryAt[uid] = b, time.Now().Add(b)
}
func (p *provisioner) succeeded(uid string) { delete(p.backoff, uid); delete(p.retryAt, uid) }

func (p *provisioner) pass(ctx context.Context) error {
	scs, err := p.kube.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	ours := map[string]*storagev1.StorageClass{}
	for i := range scs.Items {
		if scs.Items[i].Provisioner == p.driver {
			ours[scs.Items[i].Name] = &scs.Items[i]
		}
	}
	pvcs, err := p.kube.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range pvcs.Items {
		c := &pvcs.Items[i]
		sc := ours[ptrString(c.Spec.StorageClassName)]
		if sc == nil || c.Spec.VolumeName != "" || c.Status.Phase != corev1.ClaimPending ||
			c.DeletionTimestamp != nil || !p.due(string(c.UID)) {
			continue
		}
		if err := p.provision(ctx, c, sc); err != nil {
			p.failed(string(c.UID))
			p.recorder.Event(c, corev1.EventTypeWarning, "ProvisioningFailed", err.Error())
			log.Printf("provisioner stand-in: %s/%s: %v", c.Namespace, c.Name, err)
		} else {
			p.succeeded(string(c.UID))
		}
	}
	pvs, err := p.kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		if pv.Annotations[annProvisionedBy] != p.driver || pv.Spec.CSI == nil ||
			pv.Status.Phase != corev1.VolumeReleased ||
			pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || !p.due(string(pv.UID)) {
			continue
		}
		if err := p.delete(ctx, pv); err != nil {
			p.failed(string(pv.UID))
			p.recorder.Event(pv, corev1.EventTypeWarning, "VolumeFailedDelete", err.Error())
			log.Printf("provisioner stand-in: delete %s: %v", pv.Name, err)
		} else {
			p.succeeded(string(pv.UID))
		}
	}
	return nil
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func (p *provisioner) secret(ctx context.Context, name, ns string) (map[string]string, error) {
	if name == "" {
		return nil, nil
	}
	if strings.Contains(name+ns, "${") {
		return nil, fmt.Errorf("secret name templates (%s/%s) are not supported by the e2e provisioner", ns, name)
	}
	s, err := p.kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("provisioner secret %s/%s: %w", ns, name, err)
	}
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, nil
}

func accessMode(m corev1.PersistentVolumeAccessMode) (csi.VolumeCapability_AccessMode_Mode, error) {
	switch m {
	case corev1.ReadWriteOnce:
		return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, nil
	case corev1.ReadWriteOncePod:
		return csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, nil
	case corev1.ReadOnlyMany:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, nil
	case corev1.ReadWriteMany:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, nil
	}
	return 0, fmt.Errorf("unknown access mode %q", m)
}

func (p *provisioner) provision(ctx context.Context, c *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass) error {
	pvName := "pvc-" + string(c.UID)
	if c.Spec.VolumeMode != nil && *c.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return fmt.Errorf("volumeMode Block is not supported by %s", p.driver)
	}
	req, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return fmt.Errorf("claim has no storage request")
	}
	params := map[string]string{}
	fsType := p.defaultFSType
	for k, v := range sc.Parameters {
		switch {
		case k == keyFSType:
			fsType = v
		case strings.HasPrefix(k, prefixReserved):
		default:
			params[k] = v
		}
	}
	if p.extraMeta {
		params[keyPVCName], params[keyPVCNamespace], params[keyPVName] = c.Name, c.Namespace, pvName
	}
	secretName, secretNS := sc.Parameters[keyProvisionerSecret], sc.Parameters[keyProvisionerSecretNS]
	secrets, err := p.secret(ctx, secretName, secretNS)
	if err != nil {
		return err
	}
	var caps []*csi.VolumeCapability
	for _, m := range c.Spec.AccessModes {
		mode, err := accessMode(m)
		if err != nil {
			return err
		}
		caps = append(caps, &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: sc.MountOptions}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		})
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := p.ctrl.CreateVolume(cctx, &csi.CreateVolumeRequest{
		Name:               pvName,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: req.Value()},
		VolumeCapabilities: caps,
		Parameters:         params,
		Secrets:            secrets,
	})
	if err != nil {
		return fmt.Errorf("failed to provision volume with StorageClass %q: %w", sc.Name, err)
	}
	v := resp.GetVolume()
	capBytes := v.GetCapacityBytes()
	if capBytes == 0 {
		capBytes = req.Value()
	}
	vctx := map[string]string{volumeContextIdentityKey: p.identity}
	for k, val := range v.GetVolumeContext() {
		vctx[k] = val
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if sc.ReclaimPolicy != nil {
		reclaim = *sc.ReclaimPolicy
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        pvName,
			Annotations: map[string]string{annProvisionedBy: p.driver},
			Finalizers:  []string{finalizerProvisioner},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(capBytes, resource.BinarySI)},
			AccessModes:                   c.Spec.AccessModes,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: c.Namespace, Name: c.Name, UID: c.UID},
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              sc.Name,
			MountOptions:                  sc.MountOptions,
			VolumeMode:                    c.Spec.VolumeMode,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: p.driver, VolumeHandle: v.GetVolumeId(), FSType: fsType, VolumeAttributes: vctx,
			}},
		},
	}
	if secretName != "" {
		pv.Annotations[annDeletionSecretName], pv.Annotations[annDeletionSecretNS] = secretName, secretNS
	}
	if terms := topologyTerms(v.GetAccessibleTopology()); len(terms) > 0 {
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
	}
	if _, err := p.kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating PV %s: %w", pvName, err)
	}
	p.recorder.Eventf(c, corev1.EventTypeNormal, "ProvisioningSucceeded", "Successfully provisioned volume %s", pvName)
	log.Printf("provisioner stand-in: %s/%s -> %s (%s, %d bytes)", c.Namespace, c.Name, pvName, v.GetVolumeId(), capBytes)
	return nil
}

func topologyTerms(ts []*csi.Topology) []corev1.NodeSelectorTerm {
	var terms []corev1.NodeSelectorTerm
	for _, t := range ts {
		var reqs []corev1.NodeSelectorRequirement
		for k, v := range t.GetSegments() {
			reqs = append(reqs, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{v}})
		}
		if len(reqs) > 0 {
			terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: reqs})
		}
	}
	return terms
}

func (p *provisioner) delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	secrets, err := p.secret(ctx, pv.Annotations[annDeletionSecretName], pv.Annotations[annDeletionSecretNS])
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if _, err := p.ctrl.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, Secrets: secrets}); err != nil {
		return fmt.Errorf("DeleteVolume %s: %w", pv.Spec.CSI.VolumeHandle, err)
	}
	// Drop our finalizer, then the PV (as external-provisioner does).
	fresh, err := p.kube.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	var keep []string
	for _, f := range fresh.Finalizers {
		if f != finalizerProvisioner {
			keep = append(keep, f)
		}
	}
	// A merge patch (the chart grants patch on PVs, not update).
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": keep}})
	if err != nil {
		return err
	}
	if _, err := p.kube.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	if err := p.kube.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	log.Printf("provisioner stand-in: deleted %s (%s)", pv.Name, pv.Spec.CSI.VolumeHandle)
	return nil
}
