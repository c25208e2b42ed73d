package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// syncBuffer is a log sink for a test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// When worker-one's key presents worker-two's lease, the
// rejection names the key that presented it (API, metrics), keeps the
// lease's own holder, has the resource's current token, and is logged at
// warn.
func TestStolenLeaseIsAttributedToThePresenter(t *testing.T) {
	var logs syncBuffer
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{
		Auth:   keyring{"k1": {Name: "worker-one", Role: RoleWorker}, "k2": {Name: "worker-two", Role: RoleWorker}},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}, false)
	lease, err := tg.svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: "acct:1", Holder: "w2", Owner: "worker-two", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		resp, p, body := tg.rawAnswer(t, post("/v1/proxy/svc/x", "Host: gw\r\nAuthorization: Bearer k1\r\nFencing-Lease: "+lease.ID+"\r\n", "x"))
		if resp.StatusCode != http.StatusForbidden || p.Code != tokens.CodeLeaseNotOwned {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	// The two refusals are one entry, counting both.
	resp, _, body := tg.rawAnswer(t, "GET /v1/rejections HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer k2\r\n\r\n")
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Items) != 1 || list.Items[0]["repeats"] != 2.0 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	for _, it := range list.Items {
		if it["principal"] != "worker-one" || it["holder"] != "w2" || it["code"] != tokens.CodeLeaseNotOwned || it["current_token"] != 1.0 || it["token"] != 1.0 {
			t.Fatalf("rejection %v", it)
		}
	}
	resp, _, body = tg.rawAnswer(t, "GET /metrics HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer k2\r\n\r\n")
	if !strings.Contains(body, `fencegw_rejections_by_principal_total{principal="worker-one",reason="lease_not_owned"} 2`) {
		t.Fatalf("metrics %d:\n%s", resp.StatusCode, body)
	}
	if n := strings.Count(logs.String(), `level=WARN msg="write under another principal's lease refused" principal=worker-one resource=acct:1 holder=w2`); n != 2 {
		t.Fatalf("%d warnings:\n%s", n, logs.String())
	}
	if got := up.seen(); len(got) != 0 {
		t.Fatalf("upstream got %+v", got)
	}
}

// The by-principal series are bounded: past maxPrincipalSeries keys, the
// rest count as "(other)".
func TestPrincipalSeriesAreBounded(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, false)
	for i := range maxPrincipalSeries + 10 {
		tg.g.metrics.byPrincipal.count("key-"+strings.Repeat("x", i), tokens.CodeStaleToken)
	}
	if n := len(tg.g.metrics.byPrincipal.known); n != maxPrincipalSeries {
		t.Fatalf("%d principals", n)
	}
	rec := httptest.NewRecorder()
	tg.g.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `fencegw_rejections_by_principal_total{principal="(other)",reason="stale_token"} 10`) {
		t.Fatalf("metrics:\n%s", rec.Body.String())
	}
}

// A flood of unauthenticated writes with made-up leases
// is answered (403 unknown_lease, every one counted), but recorded only up
// to the flood gate's burst, so the rejection log and the store survive
// it. An authenticated caller's refusals name it and are all recorded.
func TestUnknownLeaseFloodIsNotAllRecorded(t *testing.T) {
	store, err := bolt.Open(t.TempDir()+"/fencegw.db", bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	frozen := time.Now() // the gate's bucket does not refill during the test
	svc := tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Now: func() time.Time { return frozen },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	cfg := Config{Upstreams: map[string]*url.URL{"svc": {Scheme: "http", Host: "127.0.0.1:1"}}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	g := New(svc, cfg)
	cfg.Auth = keyring{"k": {Name: "worker", Role: RoleWorker}}
	keyed := New(svc, cfg)
	send := func(n int, key string) {
		for i := range n {
			req := httptest.NewRequest("POST", "/v1/proxy/svc/x", strings.NewReader("x"))
			req.Header.Set(HeaderLease, "fl_madeup"+strings.Repeat("a", i%7))
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			rec := httptest.NewRecorder()
			if key != "" {
				keyed.ServeHTTP(rec, req)
			} else {
				g.ServeHTTP(rec, req)
			}
			if rec.Code != http.StatusForbidden {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
		}
	}
	count := func() int {
		rejs, err := svc.Rejections(t.Context(), tokens.RejectionQuery{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return len(rejs)
	}
	send(300, "")
	if got := count(); got != 100 {
		t.Fatalf("%d of 300 recorded, want the burst of 100", got)
	}
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `fencegw_rejections_total{reason="unknown_lease"} 300`) {
		t.Fatalf("metrics:\n%s", rec.Body.String())
	}
	send(50, "k")
	if got := count(); got != 150 {
		t.Fatalf("%d recorded after 50 keyed refusals, want 150", got)
	}
}

// A viewer's key may not write: its fenced write under a live lease is
// answered 403 forbidden, never reaches the upstream, and is recorded like
// every refused write (guarantee 5), naming the viewer as the presenter
// and the lease's resource, holder and token; metrics count it. The lease
// keeps working for its holder (the refusal took no lock and changed
// nothing). Without a lease there is nothing to attribute: 403, unrecorded.
func TestViewerWriteIsRefusedAndRecorded(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{
		Auth: keyring{"kv": {Name: "watcher", Role: RoleViewer}, "kw": {Name: "worker", Role: RoleWorker}},
	}, false)
	lease, err := tg.svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: "acct:7", Holder: "w", Owner: "worker", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	resp, p, body := tg.rawAnswer(t, post("/v1/proxy/svc/ledger", "Host: gw\r\nAuthorization: Bearer kv\r\nFencing-Lease: "+lease.ID+"\r\n", "x"))
	if resp.StatusCode != http.StatusForbidden || p.Code != tokens.CodeForbidden {
		t.Fatalf("viewer's write: %d %s", resp.StatusCode, body)
	}
	resp, p, body = tg.rawAnswer(t, post("/v1/proxy/svc/ledger", "Host: gw\r\nAuthorization: Bearer kv\r\n", "x"))
	if resp.StatusCode != http.StatusForbidden || p.Code != tokens.CodeForbidden {
		t.Fatalf("viewer's write without a lease: %d %s", resp.StatusCode, body)
	}
	rejs, err := tg.svc.Rejections(t.Context(), tokens.RejectionQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(rejs) != 1 {
		t.Fatalf("%d rejections recorded, want the one under a lease: %+v", len(rejs), rejs)
	}
	r := rejs[0]
	if r.Code != tokens.CodeForbidden || r.Principal != "watcher" || r.Resource != "acct:7" || r.Holder != "w" ||
		r.Token != lease.Token || r.CurrentToken != lease.Token || r.Upstream != "svc" || r.Path != "/ledger" || r.Method != "POST" {
		t.Fatalf("recorded %+v", r)
	}
	if len(up.seen()) != 0 {
		t.Fatalf("the upstream got %v", up.seen())
	}
	_, _, body = tg.rawAnswer(t, "GET /metrics HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer kv\r\n\r\n")
	if !strings.Contains(body, `fencegw_rejections_total{reason="forbidden"} 1`) ||
		!strings.Contains(body, `fencegw_rejections_by_principal_total{principal="watcher",reason="forbidden"} 1`) {
		t.Fatalf("metrics:\n%s", body)
	}
	resp, _, body = tg.rawAnswer(t, post("/v1/proxy/svc/ledger", "Host: gw\r\nAuthorization: Bearer kw\r\nFencing-Lease: "+lease.ID+"\r\n", "x"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the holder's write after the viewer's: %d %s", resp.StatusCode, body)
	}
}
