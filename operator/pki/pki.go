// Package pki is the operator's self-managed certificate authority for the
// chimerad admin API: one CA per operator installation (a Secret in the
// operator's namespace), and a server certificate per ChimeraCluster signed
// by it. The operator and the CSI controller trust only this CA when they
// call an admin API, except for a cluster whose certificate cert-manager
// issues (its Secret's ca.crt, checked by VerifyServer). Pure functions over
// PEM bytes, plus EnsureCA, which keeps the CA Secret and the CA bundle
// ConfigMap the CSI driver mounts.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

const (
	// CAValidity: the admin CA outlives many server certificates; a CA
	// closer than CARenewBefore to expiry is replaced (and with it every
	// server certificate, which is then no longer valid against it).
	CAValidity    = 10 * 365 * 24 * time.Hour
	CARenewBefore = 365 * 24 * time.Hour
	// ServerValidity of an admin server certificate; one closer than
	// ServerRenewBefore to expiry is reissued. chimerad reads it at start.
	ServerValidity    = 365 * 24 * time.Hour
	ServerRenewBefore = 60 * 24 * time.Hour

	// Keys of the CA Secret, the CA bundle ConfigMap and the per-cluster
	// server Secret (kubernetes.io/tls: tls.crt, tls.key, plus ca.crt).
	KeyCACert = "ca.crt"
	KeyCAKey  = "ca.key"
	KeyCert   = "tls.crt"
	KeyKey    = "tls.key"
)

// CA signs admin server certificates.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA makes a fresh self-signed CA (ECDSA P-256).
func NewCA(commonName string, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return ParseCA(pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", keyDER))
}

// ParseCA reads a CA from PEM and checks that the key is the certificate's.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("CA certificate: not a CA (basicConstraints)")
	}
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, errors.New("CA key: no PEM block")
	}
	var key any
	switch b.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(b.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("CA key: not a signing key")
	}
	pub, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil || !bytes.Equal(pub, cert.RawSubjectPublicKeyInfo) {
		return nil, errors.New("CA key: not the key of the CA certificate")
	}
	return &CA{Cert: cert, Key: signer, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// Pool is a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// UsableAt: the CA is not about to expire at now.
func (ca *CA) UsableAt(now time.Time) bool {
	return now.Add(CARenewBefore).Before(ca.Cert.NotAfter) && !now.Before(ca.Cert.NotBefore)
}

// IssueServer signs a server certificate for names (DNS names or IP
// addresses; the first is the subject) and returns it and its new key as
// PEM (PKCS#8).
func (ca *CA) IssueServer(names []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	if len(names) == 0 {
		return nil, nil, errors.New("a server certificate needs at least one name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(ServerValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tpl.IPAddresses = append(tpl.IPAddresses, ip)
		} else {
			tpl.DNSNames = append(tpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", keyDER), nil
}

// ServerValid: certPEM chains to this CA, carries every one of names, is
// not within ServerRenewBefore of expiry, and keyPEM is its key. Anything
// else (a new CA, a name added, a damaged Secret) means: issue again.
func (ca *CA) ServerValid(certPEM, keyPEM []byte, names []string, now time.Time) bool {
	return VerifyServer(ca.Pool(), certPEM, keyPEM, names, now.Add(ServerRenewBefore)) == nil
}

// VerifyServer checks a server certificate Secret's pair as a client will:
// the first certificate of certPEM (the others are taken as intermediates)
// chains to roots for server authentication at time at, carries every one
// of names, and keyPEM (PKCS#8, PKCS#1 or SEC 1) is its key. The error says
// which of these failed.
func VerifyServer(roots *x509.CertPool, certPEM, keyPEM []byte, names []string, at time.Time) error {
	certs, err := parseCerts(certPEM)
	if err != nil {
		return fmt.Errorf("tls.crt: %w", err)
	}
	leaf, inter := certs[0], x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if _, err := leaf.Verify(opts); err != nil {
		return fmt.Errorf("tls.crt does not verify against the CA: %w", err)
	}
	for _, n := range names {
		if err := leaf.VerifyHostname(n); err != nil {
			return fmt.Errorf("tls.crt: %w", err)
		}
	}
	signer, err := parseKey(keyPEM)
	if err != nil {
		return fmt.Errorf("tls.key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil || !bytes.Equal(pub, leaf.RawSubjectPublicKeyInfo) {
		return errors.New("tls.key is not the key of tls.crt")
	}
	return nil
}

// parseCerts reads every CERTIFICATE block of a PEM bundle; at least one.
func parseCerts(p []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, p = pem.Decode(p)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

// parseKey reads a PEM private key in any of the encodings issuers write.
func parseKey(p []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(p)
	if b == nil {
		return nil, errors.New("no PEM block")
	}
	var key any
	var err error
	switch b.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	}
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("not a signing key")
	}
	return signer, nil
}

// ParseCert reads the first certificate of a PEM bundle.
func ParseCert(p []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

// PoolFromPEM is a pool of every certificate in a PEM bundle; an error when
// it holds none.
func PoolFromPEM(p []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(p) {
		return nil, errors.New("no PEM certificate in the CA bundle")
	}
	return pool, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}
