package render

// Proves the admin API's TLS wiring as rendered: the MDS pod mounts the
// cluster's admin TLS Secret where its config looks for the certificate and
// key, probes the admin port over HTTPS, and the DS (no admin API) gets
// neither; the Secret is kubernetes.io/tls with the CA beside the pair; the
// certificate names cover how clients reach the MDS, and a certificate
// issued for them verifies against the name the clients check.

import (
	"crypto/x509"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chimera-k8s/chimera/operator/pki"
	corev1 "k8s.io/api/core/v1"
)

func TestAdminTLSRendering(t *testing.T) {
	c := smallCluster()
	ch, err := Build(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	mds := ch.MDS.Spec.Template
	if !hasVolume(mds, "admin-tls", func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == "small-admin-tls" }) {
		t.Fatalf("MDS pod must mount the admin TLS Secret: %+v", mds.Spec.Volumes)
	}
	var mountDir string
	for _, m := range mds.Spec.Containers[0].VolumeMounts {
		if m.Name == "admin-tls" {
			mountDir = m.MountPath
			if !m.ReadOnly {
				t.Error("the admin TLS mount must be read-only")
			}
		}
	}
	if mountDir != AdminTLSDir {
		t.Fatalf("admin TLS mounted at %q, want %q", mountDir, AdminTLSDir)
	}
	for _, p := range []*corev1.Probe{mds.Spec.Containers[0].LivenessProbe, mds.Spec.Containers[0].ReadinessProbe} {
		if p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Port.String() != "admin" {
			t.Errorf("MDS probe must be HTTPS on the admin port: %+v", p.HTTPGet)
		}
	}
	ds := ch.DSStatefulSet.Spec.Template
	if hasVolume(ds, "admin-tls", nil) {
		t.Error("the DS serves no admin API and must not mount its certificate")
	}
	if p := ds.Spec.Containers[0].LivenessProbe; p.HTTPGet.Scheme != corev1.URISchemeHTTP {
		t.Errorf("the DS's probe is on its plain metrics port: %+v", p.HTTPGet)
	}

	// The config names the files the Secret's keys become under the mount.
	cfg, err := RenderConfig(c, ComponentMDS, nil)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Admin struct {
			TLS struct {
				CertFile string `json:"cert_file"`
				KeyFile  string `json:"key_file"`
			} `json:"tls"`
		} `json:"admin"`
	}
	if err := json.Unmarshal(cfg, &m); err != nil {
		t.Fatal(err)
	}
	if m.Admin.TLS.CertFile != mountDir+"/"+corev1.TLSCertKey || m.Admin.TLS.KeyFile != mountDir+"/"+corev1.TLSPrivateKeyKey {
		t.Errorf("admin.tls %+v does not name the mounted Secret's files", m.Admin.TLS)
	}
	dsCfg, _ := RenderConfig(c, ComponentDS, nil)
	if strings.Contains(string(dsCfg), "tls") {
		t.Errorf("DS config must not configure admin TLS: %s", dsCfg)
	}

	// The Secret and the names.
	ca, err := pki.NewCA(pki.CACommonName, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	names := AdminTLSNames(c)
	for _, want := range []string{"small-mds.storage.svc", "small-mds", "small-mds-0.small-mds.storage.svc", "small-mds.storage.svc.cluster.local"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("admin certificate names %v lack %s", names, want)
		}
	}
	if MDSAdminServerName(c) != "small-mds.storage.svc" || !strings.HasPrefix(MDSAdminURL(c), "https://small-mds-0.small-mds.storage.svc:") {
		t.Errorf("server name %q, URL %q", MDSAdminServerName(c), MDSAdminURL(c))
	}
	certPEM, keyPEM, err := ca.IssueServer(names, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sec := AdminTLSSecret(c, certPEM, keyPEM, ca.CertPEM)
	if sec.Name != AdminTLSSecretName(c) || sec.Namespace != c.Namespace || sec.Type != corev1.SecretTypeTLS || sec.Labels[LabelCluster] != c.Name {
		t.Errorf("secret meta %+v type %s", sec.ObjectMeta, sec.Type)
	}
	if string(sec.Data[corev1.TLSCertKey]) != string(certPEM) || string(sec.Data[corev1.TLSPrivateKeyKey]) != string(keyPEM) || string(sec.Data[SecretKeyCA]) != string(ca.CertPEM) {
		t.Error("secret data must be tls.crt, tls.key and ca.crt")
	}
	leaf, err := pki.ParseCert(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: MDSAdminServerName(c)}); err != nil {
		t.Errorf("issued certificate does not verify for the checked name: %v", err)
	}
	other, _ := pki.NewCA("other", time.Now())
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: other.Pool(), DNSName: MDSAdminServerName(c)}); err == nil {
		t.Error("another CA must not verify the certificate")
	}
	if !ca.ServerValid(certPEM, keyPEM, names, time.Now()) {
		t.Error("a fresh certificate must be valid")
	}
	if ca.ServerValid(certPEM, keyPEM, append(names, "new-name.example"), time.Now()) {
		t.Error("a name added since issuing must ask for a new certificate")
	}
	if ca.ServerValid(certPEM, keyPEM, names, time.Now().Add(pki.ServerValidity-pki.ServerRenewBefore/2)) {
		t.Error("a certificate inside its renewal window must ask for a new one")
	}
	if other.ServerValid(certPEM, keyPEM, names, time.Now()) {
		t.Error("a certificate of another CA must ask for a new one")
	}
	_, otherKey, _ := ca.IssueServer(names, time.Now())
	if ca.ServerValid(certPEM, otherKey, names, time.Now()) {
		t.Error("a key that is not the certificate's must ask for a new one")
	}
}
