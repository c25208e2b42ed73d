package gateway

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

func newFuzzGateway(f *testing.F) *Gateway {
	f.Helper()
	store, err := bolt.Open(f.TempDir()+"/fuzz.db", bolt.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = store.Close() })
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	f.Cleanup(up.Close)
	target, _ := url.Parse(up.URL)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc := tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: log})
	return New(svc, Config{Upstreams: map[string]*url.URL{"svc": target}, MaxBody: 4096, Logger: log})
}

// Control-call bodies: whatever arrives, the answer is a success or a 4xx
// problem, never a 5xx or a panic.
func FuzzControlBody(f *testing.F) {
	g := newFuzzGateway(f)
	for _, s := range []string{
		`{"resource":"r","holder":"h","ttl_ms":1000}`,
		`{"resource":"r","ttl_ms":1000,"wait_ms":0}`,
		`{"resource":"","ttl_ms":1e3}`,
		`{"resource":"r","ttl_ms":"1000"}`,
		`{"resource":["r"],"ttl_ms":null}`,
		`{"ttl_ms":92233720368547758070}`,
		`[]`, `null`, ``, `{`,
	} {
		f.Add(s, "application/json", "/v1/leases")
	}
	f.Add(`{"ttl_ms":5}`, "application/merge-patch+json", "/v1/leases/fl_x/renew")
	f.Fuzz(func(t *testing.T, body, contentType, path string) {
		if !strings.HasPrefix(path, "/v1/leases") {
			path = "/v1/leases"
		}
		req := httptest.NewRequest("POST", "/", strings.NewReader(body))
		req.URL.Path = path
		req.Header.Set("Content-Type", contentType)
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		checkAnswer(t, rec)
	})
}

// Fenced-write requests: paths, lease headers and bodies of any shape.
func FuzzProxyRequest(f *testing.F) {
	g := newFuzzGateway(f)
	f.Add("svc/a/b?x=1", "fl_aaaa", []byte("body"))
	f.Add("svc/%2e%2e/x", "", []byte{})
	f.Add("nope/x", "fl_x", []byte("x"))
	f.Add("svc/%zz", "fl_x", bytes.Repeat([]byte("b"), 5000))
	f.Fuzz(func(t *testing.T, rawPath, lease string, body []byte) {
		u, err := url.Parse("http://gw/v1/proxy/" + rawPath)
		if err != nil {
			return // not a request a client could send
		}
		req := httptest.NewRequest("POST", "http://gw/", bytes.NewReader(body))
		req.URL = u
		req.RequestURI = u.RequestURI()
		if lease != "" && !strings.ContainsAny(lease, "\r\n\x00") {
			req.Header.Set(HeaderLease, lease)
		}
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		checkAnswer(t, rec)
	})
}

func checkAnswer(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code >= 500 {
		t.Fatalf("server error %d: %s", rec.Code, rec.Body)
	}
	if rec.Code >= 400 && rec.Header().Get("Content-Type") != problemContentType {
		t.Fatalf("%d without a problem document: %s", rec.Code, rec.Body)
	}
}

func FuzzCleanProxyPath(f *testing.F) {
	for _, s := range []string{"/a/b", "/a/../b", "/%2e%2e/x", "/a%2Fb", "/%00", "/./", "/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		path, err := checkProxyPath(raw)
		if err != nil {
			return
		}
		for _, seg := range strings.Split(path, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("checkProxyPath(%q) = %q keeps a dot segment", raw, path)
			}
		}
	})
}
