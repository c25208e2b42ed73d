package main

// The certificates of -tls runs.

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"time"

	"github.com/fencegw/fencegw/internal/testcert"
)

// testTLS is a self-signed certificate for 127.0.0.1, written as PEM files
// for the peers (cert, key, and both in one file for HAProxy).
type testTLS struct {
	certFile, keyFile, pemFile string
	pool                       *x509.CertPool
	config                     *tls.Config // the servers'
}

// newTestTLS makes a certificate valid for a day and writes it to dir.
func newTestTLS(dir string) (*testTLS, error) {
	c, err := testcert.Generate(24 * time.Hour)
	if err != nil {
		return nil, err
	}
	t := &testTLS{certFile: filepath.Join(dir, "cert.pem"), keyFile: filepath.Join(dir, "key.pem"), pemFile: filepath.Join(dir, "both.pem")}
	for path, data := range map[string][]byte{t.certFile: c.CertPEM, t.keyFile: c.KeyPEM, t.pemFile: append(append([]byte{}, c.CertPEM...), c.KeyPEM...)} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	t.config = &tls.Config{Certificates: []tls.Certificate{c.TLS}, MinVersion: tls.VersionTLS12}
	t.pool = c.Pool
	return t, nil
}

// serverConfig is the servers' configuration; nil (plain HTTP) for no
// testTLS.
func (t *testTLS) serverConfig() *tls.Config {
	if t == nil {
		return nil
	}
	return t.config
}

// loadServerTLS reads a certificate written by newTestTLS (a -serve child).
func loadServerTLS(certFile, keyFile string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}
