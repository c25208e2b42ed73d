// Package e2e tests fencegw end to end: real HTTP servers, a real store,
// real upstreams recording what actually reached them.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/replica"
	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/tokens"
)

// arrival is one request as the upstream saw it.
type arrival struct {
	Seq      int
	At       time.Time
	Method   string
	Path     string // escaped path with query
	Host     string
	Token    int64
	Resource string
	Header   http.Header
	Body     string
}

// upstream is a protected service that records every request it received,
// in arrival order. hold, if set, is called before answering (to keep a
// write in flight).
type upstream struct {
	*httptest.Server
	mu       sync.Mutex
	arrivals []arrival
	hold     func(a arrival)
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tok, _ := strconv.ParseInt(r.Header.Get(gateway.HeaderToken), 10, 64)
		a := arrival{At: time.Now(), Method: r.Method, Path: r.URL.RequestURI(), Host: r.Host, Token: tok,
			Resource: r.Header.Get(gateway.HeaderResource), Header: r.Header.Clone(), Body: string(body)}
		u.mu.Lock()
		a.Seq = len(u.arrivals)
		u.arrivals = append(u.arrivals, a)
		hold := u.hold
		u.mu.Unlock()
		if hold != nil {
			hold(a)
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "ok %d", a.Seq)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) setHold(h func(arrival)) {
	u.mu.Lock()
	u.hold = h
	u.mu.Unlock()
}

func (u *upstream) seen() []arrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]arrival(nil), u.arrivals...)
}

// gw is one running gateway: a replica built as fencegw serve builds it
// (replica.New).
type gw struct {
	URL   string
	store tokens.Store // the replica's store, for tests that look into it
	r     *replica.Replica
}

type options struct {
	forwardTimeout time.Duration
	drainPeriod    time.Duration
	grantWait      time.Duration
	maxBody        int64
	dir            string
	// onExclusive, if set, is told when a gateway asks for a resource's
	// exclusive lock (acquired false) and when it got it (acquired true):
	// the signal that a grant has reached the wait for in-flight writes.
	onExclusive func(resource string, acquired bool)
}

// startEmbedded runs a gateway on the embedded store in a temp dir (or
// o.dir), protecting the given upstreams.
func startEmbedded(t *testing.T, ups map[string]string, o options) *gw {
	t.Helper()
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	return startWith(t, storagemode.Config{Data: o.dir}, ups, o)
}

// startWith runs a gateway on the storage mode m, protecting the given
// upstreams, with every exclusive lock request that fails logged
// (loggedExcluder).
func startWith(t *testing.T, m storagemode.Config, ups map[string]string, o options) *gw {
	t.Helper()
	log := testLog(t)
	m.DrainPeriod = o.drainPeriod
	return startReplica(t, replica.Config{
		Mode:           m,
		Live:           gateway.Live{Upstreams: upstreamURLs(t, ups)},
		ForwardTimeout: o.forwardTimeout,
		MaxBody:        o.maxBody,
		GrantWait:      o.grantWait,
		Logger:         log,
		WrapExcluder: func(x tokens.Excluder) tokens.Excluder {
			return loggedExcluder{x, log, o.onExclusive}
		},
	})
}

// startReplica builds and serves a replica on loopback with cfg, closed
// when the test ends.
func startReplica(t testing.TB, cfg replica.Config) *gw {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	if cfg.Logger == nil {
		cfg.Logger = testLog(t)
	}
	r, err := replica.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start replica: %v", err)
	}
	r.Start()
	t.Cleanup(r.Close)
	return &gw{URL: r.URL(), store: r.Mode().Store, r: r}
}

// upstreamURLs parses the upstreams a test protects.
func upstreamURLs(t testing.TB, ups map[string]string) map[string]*url.URL {
	t.Helper()
	targets := map[string]*url.URL{}
	for name, raw := range ups {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		targets[name] = u
	}
	return targets
}

// testLogs holds each test's log (see testLog).
var testLogs sync.Map // testing.TB -> *slog.Logger

// testLog is the test's log, shared by every gateway and store it starts
// (Debug and up): kept in memory, and printed only if the test failed, so
// that a 503 or a lost session in a flaky run comes with its cause.
func testLog(t testing.TB) *slog.Logger {
	t.Helper()
	if l, ok := testLogs.Load(t); ok {
		return l.(*slog.Logger)
	}
	var mu sync.Mutex
	var buf bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	l := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	testLogs.Store(t, l)
	t.Cleanup(func() {
		// Registered before the gateways' cleanups, so it runs after them
		// and sees what they logged while closing.
		testLogs.Delete(t)
		mu.Lock()
		defer mu.Unlock()
		if t.Failed() && buf.Len() > 0 {
			t.Logf("the gateways' and stores' log:\n%s", buf.String())
		}
	})
	return l
}

// loggedExcluder logs every exclusive lock request (a grant's, a
// release's, a revoke's) that failed, with how long it waited: the gateway
// answers 503 with a generic detail, and the test log must say which lock
// failed and why. (A write's shared lock in the embedded mode fails only
// when the write's context ends, and in the PostgreSQL modes a write holds
// its fence through the Fencer's Hold, which this does not wrap.)
type loggedExcluder struct {
	tokens.Excluder
	log         *slog.Logger
	onExclusive func(resource string, acquired bool) // nil: none
}

func (l loggedExcluder) Exclusive(ctx context.Context, resource string) (func(), error) {
	start := time.Now()
	if l.onExclusive != nil {
		l.onExclusive(resource, false)
	}
	unlock, err := l.Excluder.Exclusive(ctx, resource)
	if err != nil {
		l.log.Warn("test: exclusive lock failed", "resource", resource, "waited", time.Since(start), "err", err)
	} else if l.onExclusive != nil {
		l.onExclusive(resource, true)
	}
	return unlock, err
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// --- a tiny worker-side client, speaking the wire protocol directly ---

type leaseJSON struct {
	LeaseID   string    `json:"lease_id"`
	Resource  string    `json:"resource"`
	Holder    string    `json:"holder"`
	Token     int64     `json:"token"`
	TTLms     int64     `json:"ttl_ms"`
	ExpiresAt time.Time `json:"expires_at"`
	State     string    `json:"state"`
}

type problemJSON struct {
	Type         string `json:"type"`
	Status       int    `json:"status"`
	Code         string `json:"code"`
	Field        string `json:"field"`
	Detail       string `json:"detail"`
	Resource     string `json:"resource"`
	Token        int64  `json:"token"`
	CurrentToken int64  `json:"current_token"`
	Holder       string `json:"holder"`
}

type answer struct {
	Status  int
	Header  http.Header
	Body    []byte
	Problem problemJSON
}

var httpClient = &http.Client{Timeout: 60 * time.Second}

func do(t testing.TB, method, url string, body any, header ...string) answer {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, _ := json.Marshal(b)
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, url, rd)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i])
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	a := answer{Status: resp.StatusCode, Header: resp.Header, Body: data}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		if err := json.Unmarshal(data, &a.Problem); err != nil {
			t.Fatalf("problem body %q: %v", data, err)
		}
	}
	return a
}

func acquire(t testing.TB, base, resource, holder string, ttl time.Duration) leaseJSON {
	t.Helper()
	a := do(t, "POST", base+"/v1/leases", map[string]any{"resource": resource, "holder": holder, "ttl_ms": ttl.Milliseconds()})
	if a.Status != http.StatusCreated {
		t.Fatalf("acquire %s for %s: %d %s", resource, holder, a.Status, a.Body)
	}
	var l leaseJSON
	if err := json.Unmarshal(a.Body, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

func write(t testing.TB, base, upstreamName, path string, l leaseJSON, body string) answer {
	t.Helper()
	return do(t, "POST", base+"/v1/proxy/"+upstreamName+path, body, gateway.HeaderLease, l.LeaseID)
}

type rejectionsJSON struct {
	Items      []rejectionJSON `json:"items"`
	NextCursor string          `json:"next_cursor"`
}

// rejectionJSON is one entry of the rejection log, as the list and the
// live stream's events carry it.
type rejectionJSON struct {
	ID           int64  `json:"id"`
	Resource     string `json:"resource"`
	Code         string `json:"code"`
	Token        int64  `json:"token"`
	CurrentToken int64  `json:"current_token"`
	Holder       string `json:"holder"`
	Method       string `json:"method"`
	Upstream     string `json:"upstream"`
	Path         string `json:"path"`
	LeaseHint    string `json:"lease_hint"`
	Principal    string `json:"principal"`
}

func rejections(t testing.TB, base, query string) rejectionsJSON {
	t.Helper()
	a := do(t, "GET", base+"/v1/rejections"+query, nil)
	if a.Status != http.StatusOK {
		t.Fatalf("rejections: %d %s", a.Status, a.Body)
	}
	var r rejectionsJSON
	if err := json.Unmarshal(a.Body, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func wantProblem(t testing.TB, a answer, status int, code string) {
	t.Helper()
	if a.Status != status || a.Problem.Code != code {
		t.Fatalf("got %d %s, want %d problem %q", a.Status, a.Body, status, code)
	}
	if ct := a.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
}
