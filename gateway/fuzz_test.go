package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

func newFuzzGateway(f *testing.F) *Gateway { return newFuzzProxy(f).g }

// fuzzProxy is a gateway on a real store protecting one upstream, "svc",
// that records what reached it.
type fuzzProxy struct {
	g   *Gateway
	svc *tokens.Service
	mu  sync.Mutex
	got []http.Header // headers of each request that reached the upstream
}

func (p *fuzzProxy) arrivals() []http.Header {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got
}

func newFuzzProxy(f *testing.F) *fuzzProxy {
	f.Helper()
	store, err := bolt.Open(f.TempDir()+"/fuzz.db", bolt.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = store.Close() })
	p := &fuzzProxy{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		p.mu.Lock()
		p.got = append(p.got, r.Header.Clone())
		p.mu.Unlock()
	}))
	f.Cleanup(up.Close)
	target, _ := url.Parse(up.URL)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p.svc = tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: log})
	p.g = New(p.svc, Config{Upstreams: map[string]*url.URL{"svc": target}, MaxBody: 4096, Logger: log})
	f.Cleanup(p.g.Close)
	return p
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
// Fenced writes: whatever the path, lease header and body, the answer is
// the upstream's or a 4xx problem. Under the live lease (live true), every
// write that the path rule and the body limit let through reaches the
// upstream, carrying the lease's token and never the lease id.
func FuzzProxyRequest(f *testing.F) {
	p := newFuzzProxy(f)
	lease, err := p.svc.Acquire(context.Background(), tokens.AcquireRequest{Resource: "fuzz", Holder: "fuzzer", TTL: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("svc/a/b?x=1", "fl_aaaa", []byte("body"), true)
	f.Add("svc/a/b?x=1", "fl_aaaa", []byte("body"), false)
	f.Add("svc/%2e%2e/x", "", []byte{}, true)
	f.Add("nope/x", "fl_x", []byte("x"), false)
	f.Add("svc/%zz", "fl_x", bytes.Repeat([]byte("b"), 5000), true)
	f.Add("svc", "", bytes.Repeat([]byte("b"), 4096), true)
	f.Fuzz(func(t *testing.T, rawPath, leaseID string, body []byte, live bool) {
		u, err := url.Parse("http://gw/v1/proxy/" + rawPath)
		if err != nil {
			return // not a request a client could send
		}
		req := httptest.NewRequest("POST", "http://gw/", bytes.NewReader(body))
		req.URL = u
		req.RequestURI = u.RequestURI()
		if live {
			leaseID = lease.ID
		}
		if leaseID != "" && !strings.ContainsAny(leaseID, "\r\n\x00") {
			req.Header.Set(HeaderLease, leaseID)
		}
		before := len(p.arrivals())
		rec := httptest.NewRecorder()
		p.g.ServeHTTP(rec, req)
		checkAnswer(t, rec)
		if !live {
			return
		}
		name, below, _ := strings.Cut(strings.TrimPrefix(u.EscapedPath(), proxyPrefix), "/")
		if _, err := checkProxyPath("/" + below); name != "svc" || err != nil || len(body) > 4096 {
			return // refused before the lease is looked at
		}
		got := p.arrivals()
		if strings.ContainsFunc(u.RawQuery, notInRequestLine) {
			// A request line cannot carry it: forwarded, it would split
			// the upstream's request line.
			if rec.Code != http.StatusBadRequest || len(got) != before {
				t.Fatalf("a write whose query %q has a space or control byte: %d %s, %d requests reached the upstream; want 400 and none", u.RawQuery, rec.Code, rec.Body, len(got)-before)
			}
			return
		}
		if rec.Code != http.StatusOK || len(got) != before+1 {
			t.Fatalf("a write under the live lease to %q: %d %s, %d requests reached the upstream; want it forwarded", u.RequestURI(), rec.Code, rec.Body, len(got)-before)
		}
		h := got[len(got)-1]
		if h.Get(HeaderToken) != strconv.FormatInt(lease.Token, 10) || h.Get(HeaderLease) != "" {
			t.Fatalf("forwarded with %s %q and %s %q; want the lease's token and no lease id", HeaderToken, h.Get(HeaderToken), HeaderLease, h.Get(HeaderLease))
		}
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

// Header names on fenced writes: whatever name a client sends, no header
// reaches the upstream whose name a CGI/WSGI server folds (ASCII case, '_'
// for '-') into a Fencing-*, X-Forwarded-*, hop-by-hop or framing name
// unless it is the gateway's own, and the upstream's Fencing-Token is the
// gateway's alone.
func FuzzProxyHeaderName(f *testing.F) {
	store, err := bolt.Open(f.TempDir()+"/fuzz.db", bolt.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = store.Close() })
	var got sync.Map // by path: the headers the upstream got
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Store(r.URL.Path, r.Header.Clone())
	}))
	f.Cleanup(up.Close)
	target, _ := url.Parse(up.URL)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc := tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: log})
	g := New(svc, Config{Upstreams: map[string]*url.URL{"svc": target}, Logger: log})
	p, err := svc.Acquire(f.Context(), tokens.AcquireRequest{Resource: "r", Holder: "h", TTL: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"Fencing_Token", "fencing_lease", "X_Forwarded_For", "Content_Length", "Keep_Alive",
		"Proxy_Connection", "X-Forwarded_Host", "Fencing-Token", "Connection", "My_Header", "X_Real_IP", "TE"} {
		f.Add(s, "999")
	}
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, name, value string) {
		if !validFieldName(name) || strings.ContainsFunc(value, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
			return // Go's server refuses such a head before any handler
		}
		path := "/x" + strconv.FormatInt(n.Add(1), 10)
		req := httptest.NewRequest("POST", "http://gw/v1/proxy/svc"+path, strings.NewReader("b"))
		req.Header.Set(HeaderLease, p.ID)
		req.Header.Add(name, value)
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		checkAnswer(t, rec)
		if rec.Code != http.StatusOK {
			return
		}
		v, ok := got.LoadAndDelete(path)
		if !ok {
			t.Fatalf("200 without reaching the upstream: %s", rec.Body)
		}
		h := v.(http.Header)
		for k, v := range h {
			if k == HeaderToken || k == HeaderResource || k == "Content-Length" || strings.HasPrefix(k, "X-Forwarded-") && strings.IndexByte(k, '_') < 0 {
				continue // the gateway's own, and the framing Go's upstream parsed
			}
			if protectedFold(k) {
				t.Fatalf("%q: %v reached the upstream", k, v)
			}
		}
		if tok := h.Values(HeaderToken); len(tok) != 1 || tok[0] != "1" {
			t.Fatalf("the upstream's token: %v", tok)
		}
	})
}

// FuzzRemoteIP holds remoteIP to net.SplitHostPort's host.
func FuzzRemoteIP(f *testing.F) {
	for _, s := range []string{"127.0.0.1:5432", "[::1]:80", "::1", "host", "a:b:c", "[a]:b", "a]:b", "a:[b", ":", ":80", "1.2.3.4:", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		ip, ok := remoteIP(addr)
		wantIP, _, err := net.SplitHostPort(addr)
		if ip != wantIP || ok != (err == nil) {
			t.Fatalf("remoteIP(%q) = %q, %v; SplitHostPort: %q, %v", addr, ip, ok, wantIP, err)
		}
	})
}
