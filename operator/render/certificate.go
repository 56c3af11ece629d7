package render

import (
	"fmt"
	"net"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/pki"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// cert-manager's Certificate, written as unstructured data so the operator
// needs no cert-manager Go module (nor its CRD at start: a cluster that
// names no issuer never touches the kind).
var CertificateGVK = schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Certificate"}

// CertificateCRDName is the CRD that serves CertificateGVK.
const CertificateCRDName = "certificates.cert-manager.io"

// AdminCertificateName is the cert-manager Certificate that issues the MDS's
// admin certificate into AdminTLSSecretName (the same name).
func AdminCertificateName(c *chimerav1.ChimeraCluster) string { return AdminTLSSecretName(c) }

// CABundleKey is the key of the operator's admin CA ConfigMap under which a
// cluster whose certificate cert-manager issues publishes its Secret's
// ca.crt. The CSI controller, verifying a server named N, trusts the file
// "N.ca.crt" beside its --admin-ca-file when there is one, instead of the
// operator's CA (csi/README.md): so one cluster's issuer is never trusted
// for another cluster's name.
func CABundleKey(c *chimerav1.ChimeraCluster) string { return MDSAdminServerName(c) + ".ca.crt" }

// IssuerRef is the cluster's cert-manager issuer with the schema's defaults
// filled in, or nil when the operator's own CA signs.
func IssuerRef(c *chimerav1.ChimeraCluster) *chimerav1.IssuerReference {
	ref := c.Spec.AdminTLS.IssuerRef
	if ref == nil {
		return nil
	}
	out := *ref
	if out.Kind == "" {
		out.Kind = chimerav1.IssuerKindIssuer
	}
	if out.Group == "" {
		out.Group = chimerav1.IssuerGroupCertManager
	}
	return &out
}

// IssuerDescription names an issuer for messages: "Issuer ca-issuer
// (cert-manager.io)".
func IssuerDescription(ref *chimerav1.IssuerReference) string {
	return fmt.Sprintf("%s %s (%s)", ref.Kind, ref.Name, ref.Group)
}

// AdminCertificate is the cert-manager Certificate for the MDS's admin API:
// the same names (DNS names and IP addresses) as the operator's own
// certificate (AdminTLSNames), the same lifetime and renewal margin, an
// ECDSA P-256 key renewed with each certificate, and the Secret the MDS
// mounts, labelled as the cluster's children are so the operator (which
// caches only its own objects) sees it. Nil when the cluster names no issuer.
func AdminCertificate(c *chimerav1.ChimeraCluster) *unstructured.Unstructured {
	ref := IssuerRef(c)
	if ref == nil {
		return nil
	}
	var dns, ips []any
	for _, n := range AdminTLSNames(c) {
		if net.ParseIP(n) != nil {
			ips = append(ips, n)
		} else {
			dns = append(dns, n)
		}
	}
	labels := map[string]any{}
	for k, v := range objectMeta(c, "", "").Labels {
		labels[k] = v
	}
	spec := map[string]any{
		"secretName":     AdminTLSSecretName(c),
		"secretTemplate": map[string]any{"labels": labels},
		// No commonName: a name may be longer than the 64 bytes a CN holds,
		// and clients check the SANs.
		"dnsNames":    dns,
		"duration":    goDuration(pki.ServerValidity),
		"renewBefore": goDuration(pki.ServerRenewBefore),
		"privateKey": map[string]any{
			"algorithm": "ECDSA", "size": int64(256), "encoding": "PKCS8", "rotationPolicy": "Always",
		},
		"usages":    []any{"digital signature", "server auth"},
		"issuerRef": map[string]any{"name": ref.Name, "kind": ref.Kind, "group": ref.Group},
	}
	if len(ips) > 0 {
		spec["ipAddresses"] = ips
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(CertificateGVK)
	m := objectMeta(c, AdminCertificateName(c), "")
	u.SetNamespace(m.Namespace)
	u.SetName(m.Name)
	u.SetLabels(m.Labels)
	return u
}

// goDuration writes d the way cert-manager's duration fields read it
// ("8760h0m0s").
func goDuration(d time.Duration) string { return d.String() }

// AdminTLSSecretProblem says why the admin TLS Secret's data cannot serve the
// MDS yet ("" when it can): tls.crt, tls.key and ca.crt must be present, and
// the certificate must carry every one of AdminTLSNames, verify against the
// Secret's own ca.crt at now and match the key. This is what a cert-manager
// issued Secret is waited for.
func AdminTLSSecretProblem(c *chimerav1.ChimeraCluster, data map[string][]byte, now time.Time) string {
	var missing []string
	for _, k := range []string{"tls.crt", "tls.key", SecretKeyCA} {
		if len(data[k]) == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("Secret %s has no %v yet", AdminTLSSecretName(c), missing)
	}
	roots, err := pki.PoolFromPEM(data[SecretKeyCA])
	if err != nil {
		return fmt.Sprintf("Secret %s: ca.crt: %v", AdminTLSSecretName(c), err)
	}
	if err := pki.VerifyServer(roots, data["tls.crt"], data["tls.key"], AdminTLSNames(c), now); err != nil {
		return fmt.Sprintf("Secret %s: %v", AdminTLSSecretName(c), err)
	}
	return ""
}
