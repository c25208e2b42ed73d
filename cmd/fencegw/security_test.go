package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/auth"
	"github.com/fencegw/fencegw/internal/testcert"
)

func TestServeRefusesOpenListenerWithoutAuth(t *testing.T) {
	dir := t.TempDir()
	authFile := filepath.Join(dir, "auth.yaml")
	data := "keys:\n  - {name: w, sha256: " + auth.Hash("k") + ", role: worker}\n" +
		"upstreams:\n  - {upstream: s, headers: {Authorization: Bearer x}}\n"
	if err := os.WriteFile(authFile, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--listen", "127.0.0.1:0"}, true},
		{[]string{"--listen", "[::1]:0"}, true},
		{[]string{"--listen", "localhost:8080"}, true},
		{[]string{"--listen", ":8080"}, false},
		{[]string{"--listen", "0.0.0.0:8080"}, false},
		{[]string{"--listen", "10.1.2.3:8080"}, false},
		{[]string{"--listen", "gateway.internal:8080"}, false},
		{[]string{"--listen", ":8080", "--insecure-no-auth"}, true},
		{[]string{"--listen", ":8080", "--auth-file", authFile, "--upstream", "s=http://127.0.0.1:9"}, true},
		// credentials for an upstream that is not configured
		{[]string{"--listen", ":8080", "--auth-file", authFile}, false},
		{[]string{"--auth-file", filepath.Join(dir, "missing.yaml")}, false},
		{[]string{"--tls-cert", authFile}, false},
		{[]string{"--tls-cert", authFile, "--tls-key", authFile}, false},
	} {
		cfg, err := parseServe(tc.args, env)
		if tc.ok != (err == nil) {
			t.Errorf("parseServe(%q) = %v; want ok %v", tc.args, err, tc.ok)
		}
		if err != nil && !errors.Is(err, errUsage) {
			t.Errorf("parseServe(%q): %v is not a usage error (exit 2)", tc.args, err)
		}
		if err == nil && slices.Contains(tc.args, "--auth-file") && (cfg.Auth == nil || cfg.Auth.Keys.Len() != 1) {
			t.Errorf("parseServe(%q): auth file not loaded", tc.args)
		}
	}
}

func TestHashKey(t *testing.T) {
	var out strings.Builder
	if err := hashKey(strings.NewReader("fgk_abc\n"), &out); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != auth.Hash("fgk_abc") {
		t.Fatalf("hash-key printed %q", got)
	}
	if err := hashKey(strings.NewReader(""), &out); !errors.Is(err, errUsage) {
		t.Fatalf("hash-key of nothing: %v", err)
	}
}

// The real binary, plain and with TLS: a request with both Content-Length
// and Transfer-Encoding is refused (400, connection closed, nothing
// forwarded) after a good request on the same keep-alive connection; over
// TLS the gateway speaks HTTP/1.1 (ALPN), and the upstream is told https.
// A client that stalls in its body gets 408 request_timeout.
func TestSecurityFramingAndSlowBodyRealBinary(t *testing.T) {
	type seen struct{ path, proto, body string }
	var mu sync.Mutex
	var got []seen
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.URL.Path, r.Header.Get("X-Forwarded-Proto"), string(b)})
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	defer up.Close()

	for _, tlsOn := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "tls"}[tlsOn]
		t.Run(name, func(t *testing.T) {
			mu.Lock()
			got = nil
			mu.Unlock()
			args := []string{"--data", t.TempDir(), "--upstream", "svc=" + up.URL, "--body-timeout", "300ms"}
			scheme, client, dial := "http", http.DefaultClient, func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }
			if tlsOn {
				certFile, keyFile, pool := writeTestCert(t)
				args = append(args, "--tls-cert", certFile, "--tls-key", keyFile)
				clientTLS := &tls.Config{RootCAs: pool, NextProtos: []string{"h2", "http/1.1"}}
				scheme = "https"
				client = &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS, ForceAttemptHTTP2: true}}
				dial = func(addr string) (net.Conn, error) {
					c, err := tls.Dial("tcp", addr, clientTLS)
					if err == nil && c.ConnectionState().NegotiatedProtocol != "http/1.1" {
						t.Errorf("ALPN %q, want http/1.1", c.ConnectionState().NegotiatedProtocol)
					}
					return c, err
				}
			}
			p := startProc(t, args...)
			base := scheme + "://" + p.addr

			req, _ := http.NewRequest("POST", base+"/v1/leases", strings.NewReader(`{"resource":"r","holder":"h","ttl_ms":60000}`))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var l lease
			_ = json.NewDecoder(resp.Body).Decode(&l)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || resp.ProtoMajor != 1 {
				t.Fatalf("acquire: %d %s", resp.StatusCode, resp.Proto)
			}
			head := func(path string) string {
				return "POST /v1/proxy/svc" + path + " HTTP/1.1\r\nHost: localhost\r\nFencing-Lease: " + l.LeaseID + "\r\n"
			}

			c, err := dial(p.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			_, _ = io.WriteString(c, head("/good")+"Content-Length: 4\r\n\r\ngood")
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 || resp.Close {
				t.Fatalf("good write: %v %v", resp, err)
			} else {
				_, _ = io.Copy(io.Discard, resp.Body)
			}
			_, _ = io.WriteString(c, head("/both")+"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"+head("/smuggled")+"Content-Length: 0\r\n\r\n")
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 400 || !resp.Close || !strings.Contains(string(b), `"code":"invalid_request"`) ||
				!strings.Contains(string(b), `"field":"Content-Length, Transfer-Encoding"`) {
				t.Fatalf("both: %d close=%v %s", resp.StatusCode, resp.Close, b)
			}
			if _, err := br.ReadByte(); err == nil {
				t.Fatal("the connection stayed open after the refusal")
			}

			// A body that stalls: 408.
			c2, err := dial(p.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			_ = c2.SetDeadline(time.Now().Add(15 * time.Second))
			_, _ = io.WriteString(c2, head("/stall")+"Content-Length: 100\r\n\r\npart")
			resp, err = http.ReadResponse(bufio.NewReader(c2), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ = io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), `"code":"request_timeout"`) || !strings.Contains(string(b), `"field":"body"`) {
				t.Fatalf("stalled body: %d %s", resp.StatusCode, b)
			}

			mu.Lock()
			defer mu.Unlock()
			var paths []string
			for _, s := range got {
				paths = append(paths, s.path)
				if want := map[bool]string{false: "http", true: "https"}[tlsOn]; s.proto != want {
					t.Errorf("%s: X-Forwarded-Proto %q, want %q", s.path, s.proto, want)
				}
				if s.path == "/stall" && s.body == strings.Repeat("x", 100) {
					t.Error("the stalled write reached the upstream whole")
				}
			}
			if p := strings.Join(paths, " "); p != "/good" && p != "/good /stall" {
				t.Fatalf("upstream got %q, want /good (and part of /stall)", paths)
			}
		})
	}
}

// writeTestCert writes a self-signed certificate for 127.0.0.1 and its key
// as PEM files.
func writeTestCert(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	c := testcert.New(t)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, c.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, c.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, c.Pool
}
