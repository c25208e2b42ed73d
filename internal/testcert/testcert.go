// Package testcert makes throwaway self-signed certificates for 127.0.0.1,
// for tests and load runs that serve TLS.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"testing"
	"time"
)

// Cert is a self-signed P-256 certificate for 127.0.0.1 and localhost.
type Cert struct {
	TLS     tls.Certificate // for a tls.Config's Certificates
	Pool    *x509.CertPool  // trusts it, for a client's RootCAs
	CertPEM []byte
	KeyPEM  []byte // PKCS #8
}

// New makes a Cert valid for an hour either side of now, failing t on
// error.
func New(t testing.TB) Cert {
	t.Helper()
	c, err := Generate(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Generate makes a Cert valid from an hour before now until validFor after
// it.
func Generate(validFor time.Duration) (Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Cert{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return Cert{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "fencegw test"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validFor),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return Cert{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Cert{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return Cert{}, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return Cert{
		TLS:     tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert},
		Pool:    pool,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}
