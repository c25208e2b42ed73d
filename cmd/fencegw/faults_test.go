package main

// Fault tests: real `fencegw serve` replicas (race-enabled binaries, see
// TestMain) sharing a private PostgreSQL cluster and, in the Redis mode, a
// private Redis (backends_test.go), with a recording upstream. Each test
// breaks one thing mid-run and checks the guarantees of docs/design.md that
// must survive it. What a fault is allowed to cost (503s, lost leases,
// waits) is said next to each check. This file holds the harness (the
// recording upstream, HTTP calls, the token ledger, the churning workers)
// and the store faults: Redis loses its data, PostgreSQL restarts. The
// replica faults (killed, frozen) are in faults_replica_test.go.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// --- a recording upstream ---

type delivery struct {
	Resource string
	Token    int64
	Path     string
	Body     string
	At       time.Time
}

// recUpstream records every write it receives, in arrival order. A write to
// a path under /hold/ blocks until release is closed (or the connection
// breaks), so a test can keep a write in flight.
type recUpstream struct {
	*httptest.Server
	mu        sync.Mutex
	got       []delivery
	release   chan struct{}
	once      sync.Once
	entered   chan string // bodies of held writes, as they arrive
	cancelled chan string // bodies of held writes whose connection broke
}

func newUpstream(t *testing.T) *recUpstream {
	u := &recUpstream{release: make(chan struct{}), entered: make(chan string, 16), cancelled: make(chan string, 16)}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		u.Release()
		u.Close()
	})
	return u
}

func (u *recUpstream) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	tok, _ := strconv.ParseInt(r.Header.Get("Fencing-Token"), 10, 64)
	u.mu.Lock()
	u.got = append(u.got, delivery{Resource: r.Header.Get("Fencing-Resource"), Token: tok, Path: r.URL.Path, Body: string(b), At: time.Now()})
	u.mu.Unlock()
	if strings.HasPrefix(r.URL.Path, "/hold/") {
		u.entered <- string(b)
		select {
		case <-u.release:
		case <-r.Context().Done():
			u.cancelled <- string(b)
			return
		}
	}
	_, _ = io.WriteString(w, "ok")
}

// Release lets held writes answer.
func (u *recUpstream) Release() { u.once.Do(func() { close(u.release) }) }

func (u *recUpstream) deliveries() []delivery {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.got)
}

func (u *recUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.got)
}

func (u *recUpstream) received(body string) bool {
	for _, d := range u.deliveries() {
		if d.Body == body {
			return true
		}
	}
	return false
}

// checkOrder asserts guarantee 1 as the upstream sees it: per resource, the
// tokens of the writes it received never go down (a write of an older token
// arriving after one of a newer token would be a stale write), and every
// write carried a token.
func (u *recUpstream) checkOrder(t *testing.T) {
	t.Helper()
	last := map[string]delivery{}
	for i, d := range u.deliveries() {
		if d.Token < 1 || d.Resource == "" {
			t.Errorf("delivery %d without Fencing-Token/Fencing-Resource: %+v", i, d)
			continue
		}
		if prev, ok := last[d.Resource]; ok && d.Token < prev.Token {
			t.Errorf("stale write reached the upstream: %s token %d (%q) arrived after token %d (%q)",
				d.Resource, d.Token, d.Body, prev.Token, prev.Body)
		}
		last[d.Resource] = d
	}
}

// --- HTTP without *testing.T (safe from any goroutine) ---

var faultClient = &http.Client{Timeout: 30 * time.Second}

type answer struct {
	code   int
	header http.Header
	body   []byte
	err    error
	took   time.Duration
}

func (a answer) problemCode() string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(a.body, &p)
	return p.Code
}

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s", a.code, bytes.TrimSpace(a.body))
}

func call(method, url string, body []byte, header ...string) answer {
	start := time.Now()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := faultClient.Do(req)
	if err != nil {
		return answer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, header: resp.Header, body: b, err: err, took: time.Since(start)}
}

func grant(base, res, holder string, ttl, wait time.Duration) (lease, answer) {
	b, _ := json.Marshal(map[string]any{"resource": res, "holder": holder, "ttl_ms": ttl.Milliseconds(), "wait_ms": wait.Milliseconds()})
	a := call("POST", base+"/v1/leases", b)
	var l lease
	if a.err == nil && a.code == http.StatusCreated {
		_ = json.Unmarshal(a.body, &l)
	}
	return l, a
}

func fencedWrite(base, leaseID, path, body string) answer {
	return call("POST", base+"/v1/proxy/svc"+path, []byte(body), "Fencing-Lease", leaseID)
}

func release(base, leaseID string) answer {
	return call("DELETE", base+"/v1/leases/"+leaseID, nil)
}

// waitExpired waits until base reports the lease expired: the gateway's
// clock decides when a TTL ran out, not the test's.
func waitExpired(t *testing.T, base, leaseID string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		a := call("GET", base+"/v1/leases/"+leaseID, nil)
		var l lease
		if a.err == nil && a.code == http.StatusOK && json.Unmarshal(a.body, &l) == nil && l.State == "expired" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s not expired at %s after 30 s: %v", leaseID, base, a)
		}
	}
}

// want503 asserts a 503 carries the problem code and a Retry-After of at
// least one whole second.
func want503(t *testing.T, what string, a answer, code string) {
	t.Helper()
	if a.err != nil || a.code != http.StatusServiceUnavailable || a.problemCode() != code {
		t.Errorf("%s: got %v, want 503 %s", what, a, code)
		return
	}
	if n, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || n < 1 {
		t.Errorf("%s: Retry-After %q, want whole seconds >= 1", what, a.header.Get("Retry-After"))
	}
}

func want409(t *testing.T, what string, a answer, codes ...string) {
	t.Helper()
	if a.err != nil || a.code != http.StatusConflict || !slices.Contains(codes, a.problemCode()) {
		t.Errorf("%s: got %v, want 409 %v", what, a, codes)
	}
}

func startReplicas(t *testing.T, n int, args ...string) []*proc {
	t.Helper()
	var ps []*proc
	for range n {
		ps = append(ps, startProc(t, append([]string{"--log-level", "warn"}, args...)...))
	}
	return ps
}

func alive(p *proc) bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// --- token bookkeeping for workers ---

// tokenLedger records every token any worker saw, per resource, and when.
type tokenLedger struct {
	mu    sync.Mutex
	seen  map[string]map[int64]bool
	max   map[string]int64
	dups  []string
	times map[string][]grantAt
}

type grantAt struct {
	token int64
	at    time.Time
}

func newTokenLedger() *tokenLedger {
	return &tokenLedger{seen: map[string]map[int64]bool{}, max: map[string]int64{}, times: map[string][]grantAt{}}
}

func (l *tokenLedger) add(res string, tok int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[res] == nil {
		l.seen[res] = map[int64]bool{}
	}
	if l.seen[res][tok] {
		l.dups = append(l.dups, fmt.Sprintf("%s token %d granted twice", res, tok))
	}
	l.seen[res][tok] = true
	l.max[res] = max(l.max[res], tok)
	l.times[res] = append(l.times[res], grantAt{tok, time.Now()})
}

// check: no token granted twice; every token granted after `after` is above
// every token granted before `before`; a fresh grant on each resource now
// (through base) is above everything seen.
func (l *tokenLedger) check(t *testing.T, before, after time.Time, bases []string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range l.dups {
		t.Errorf("guarantee 3 violated: %s", d)
	}
	for res, gs := range l.times {
		var maxBefore int64
		minAfter := int64(-1)
		for _, g := range gs {
			if g.at.Before(before) {
				maxBefore = max(maxBefore, g.token)
			}
			if g.at.After(after) && (minAfter < 0 || g.token < minAfter) {
				minAfter = g.token
			}
		}
		if minAfter >= 0 && minAfter <= maxBefore {
			t.Errorf("%s: token %d granted after the fault, but %d was granted before it", res, minAfter, maxBefore)
		}
	}
	i := 0
	for res, seen := range l.max {
		base := bases[i%len(bases)]
		i++
		nl, a := grant(base, res, "final", time.Second, 10*time.Second)
		if a.code != http.StatusCreated {
			t.Errorf("final grant on %s: %v", res, a)
			continue
		}
		if nl.Token <= seen {
			t.Errorf("guarantee 3 violated: %s granted token %d after %d was handed out", res, nl.Token, seen)
		}
	}
}

// churn runs workers that acquire, write and release on a few resources
// through changing replicas until ctx ends. Outcomes are counted by phase
// (a write is "after" if it started after afterFault is set).
type churn struct {
	ledger     *tokenLedger
	afterFault atomic.Bool
	mu         sync.Mutex
	outcomes   map[string]int // phase/op/status
	unexpected []string
}

func (c *churn) note(op string, a answer) {
	phase := "before"
	if c.afterFault.Load() {
		phase = "after"
	}
	status := "err"
	if a.err == nil {
		status = strconv.Itoa(a.code)
		if code := a.problemCode(); code != "" {
			status += " " + code
		}
	}
	c.mu.Lock()
	c.outcomes[phase+" "+op+" "+status]++
	c.mu.Unlock()
}

func (c *churn) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outcomes[key]
}

// waitWrites waits until n writes of phase ("before" or "after" the fault)
// went through, so that a phase is judged on what happened in it rather
// than on how much a loaded machine did in a guessed time.
func (c *churn) waitWrites(t *testing.T, phase string, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); c.count(phase+" write 200") < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d writes went through %s the fault in 30 s", c.count(phase+" write 200"), phase)
		}
	}
}

func (c *churn) run(ctx context.Context, wg *sync.WaitGroup, bases []string, workers, resources int, prefix string) {
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := fmt.Sprintf("%s-%d", prefix, w%resources)
			for i := 0; ctx.Err() == nil; i++ {
				// The wait covers a loaded machine's handovers: an acquire
				// answers fence_busy once its wait_ms is over.
				l, a := grant(bases[(w+i)%len(bases)], res, fmt.Sprintf("w%d", w), 2*time.Second, 3*time.Second)
				c.note("grant", a)
				if a.code != http.StatusCreated {
					if a.err != nil || a.code == http.StatusServiceUnavailable {
						time.Sleep(20 * time.Millisecond)
					}
					continue
				}
				c.ledger.add(res, l.Token)
				wa := fencedWrite(bases[(w+i+1)%len(bases)], l.LeaseID, "/"+res, fmt.Sprintf("%s w%d token %d", res, w, l.Token))
				c.note("write", wa)
				if wa.err == nil && wa.code != http.StatusOK && wa.code != http.StatusConflict && wa.code != http.StatusServiceUnavailable {
					c.mu.Lock()
					c.unexpected = append(c.unexpected, "write: "+wa.String())
					c.mu.Unlock()
				}
				release(bases[(w+i+2)%len(bases)], l.LeaseID)
			}
		}()
	}
}

func (c *churn) log(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, 0, len(c.outcomes))
	for k := range c.outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-40s %d\n", k, c.outcomes[k])
	}
	t.Logf("worker outcomes:\n%s", b.String())
	for _, u := range c.unexpected {
		t.Errorf("unexpected answer: %s", u)
	}
}

// --- the faults ---

// Redis loses every lease claim mid-run (FLUSHALL). Allowed cost: holders
// lose their leases early (their writes get 409 lease_expired) and a new
// grant may come at once. Guaranteed: no token is reissued (the tokens come
// from PostgreSQL), the stale holder is fenced, writes resume, and no stale
// write reaches the upstream.
func TestFaultRedisFlushAll(t *testing.T) {
	testRedisLoss(t, func(t *testing.T, r *redisServer) {
		if err := r.Client().FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	})
}

// Redis restarted mid-run without persistence: the same as a FLUSHALL, plus
// a moment in which Redis refuses connections (grants and writes answer 503
// then, which the workers retry).
func TestFaultRedisRestart(t *testing.T) {
	testRedisLoss(t, func(t *testing.T, r *redisServer) {
		if err := r.Restart(); err != nil {
			t.Fatal(err)
		}
	})
}

func testRedisLoss(t *testing.T, fault func(*testing.T, *redisServer)) {
	pg := startPostgres(t)
	rd := startRedis(t)
	up := newUpstream(t)
	ps := startReplicas(t, 3, "--postgres", pg.URL(), "--redis", rd.URL(), "--upstream", "svc="+up.URL,
		"--forward-timeout", "5s", "--drain-period", "1s", "--grant-wait", "2s")
	bases := []string{ps[0].url(), ps[1].url(), ps[2].url()}

	// A holds "held" across the fault.
	a, ans := grant(bases[0], "held", "A", time.Minute, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("A: %v", ans)
	}
	if w := fencedWrite(bases[1], a.LeaseID, "/held", "A before"); w.code != http.StatusOK {
		t.Fatalf("A before the fault: %v", w)
	}

	c := &churn{ledger: newTokenLedger(), outcomes: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	c.run(ctx, &wg, bases, 6, 4, "churn")
	c.waitWrites(t, "before", 10)
	faultStart := time.Now()
	fault(t, rd)
	faultEnd := time.Now()
	c.afterFault.Store(true)
	t.Logf("fault took %v", faultEnd.Sub(faultStart).Round(time.Millisecond))
	c.waitWrites(t, "after", 10)
	cancel()
	wg.Wait()
	c.log(t)
	if c.count("before write 200") == 0 {
		t.Fatal("void run: no write went through before the fault")
	}
	if c.count("after write 200") == 0 {
		t.Error("writes did not resume after the fault")
	}

	// A's claim is gone: its lease has ended (Redis decides liveness), so
	// its write is refused, not forwarded.
	want409(t, "A after the fault, nothing newer granted", fencedWrite(bases[2], a.LeaseID, "/held", "A after fault"), "lease_expired", "stale_token")
	// B can take the resource at once, with a larger token from PostgreSQL.
	b, ans := grant(bases[1], "held", "B", time.Minute, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("B after the fault: %v", ans)
	}
	if b.Token <= a.Token {
		t.Fatalf("guarantee 3 violated: B got token %d after A's %d", b.Token, a.Token)
	}
	want409(t, "A after B's grant", fencedWrite(bases[0], a.LeaseID, "/held", "A stale"), "stale_token")
	if w := fencedWrite(bases[2], b.LeaseID, "/held", "B"); w.code != http.StatusOK {
		t.Errorf("B's write: %v", w)
	}
	for _, body := range []string{"A after fault", "A stale"} {
		if up.received(body) {
			t.Errorf("guarantee 1 violated: %q reached the upstream", body)
		}
	}
	c.ledger.check(t, faultStart, faultEnd, bases)
	up.checkOrder(t)
}

// PostgreSQL restarted mid-run. While it is down: grants and writes answer
// 503 store_unavailable with Retry-After (quickly, not after a hang),
// /readyz fails, nothing is forwarded. After it is back, the same gateway
// processes serve again (no restart), the lease granted before the outage
// still writes, and tokens continue.
func TestFaultPostgresRestart(t *testing.T) {
	pg := startPostgres(t)
	up := newUpstream(t)
	ps := startReplicas(t, 2, "--postgres", pg.URL(), "--upstream", "svc="+up.URL,
		"--forward-timeout", "5s", "--drain-period", "1s", "--grant-wait", "2s", "--pg-statement-timeout", "2s")
	bases := []string{ps[0].url(), ps[1].url()}

	a, ans := grant(bases[0], "r", "A", time.Minute, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("A: %v", ans)
	}
	if w := fencedWrite(bases[1], a.LeaseID, "/r", "A before"); w.code != http.StatusOK {
		t.Fatalf("A before the outage: %v", w)
	}
	// Some history on another resource, to see tokens continue.
	c := &churn{ledger: newTokenLedger(), outcomes: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	c.run(ctx, &wg, bases, 4, 2, "churn")
	c.waitWrites(t, "before", 10)

	stopAt := time.Now()
	c.afterFault.Store(true)
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL stopped in %v", time.Since(stopAt).Round(time.Millisecond))
	forwarded := up.count()

	for round := range 3 {
		for i, base := range bases {
			what := fmt.Sprintf("replica %d, round %d", i, round)
			if r := call("GET", base+"/readyz", nil); r.err != nil || r.code == http.StatusOK {
				t.Errorf("%s: /readyz while PostgreSQL is down: %v", what, r)
			}
			_, g := grant(base, "fresh", "X", time.Second, 0)
			want503(t, what+": grant", g, "store_unavailable")
			w := fencedWrite(base, a.LeaseID, "/r", "A during outage")
			want503(t, what+": write", w, "store_unavailable")
			// The bound is the behaviour (a refused connection is
			// answered in milliseconds; a hang is not), so it is generous.
			if g.took > 5*time.Second || w.took > 5*time.Second {
				t.Errorf("%s: answers took %v and %v; fail closed means fail fast too", what, g.took, w.took)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if n := up.count(); n != forwarded {
		t.Errorf("guarantee 4 violated: %d writes forwarded while PostgreSQL was down", n-forwarded)
	}

	startAt := time.Now()
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	for i, base := range bases {
		for {
			if r := call("GET", base+"/readyz", nil); r.err == nil && r.code == http.StatusOK {
				break
			}
			if time.Since(startAt) > 20*time.Second {
				t.Fatalf("replica %d not ready 20 s after PostgreSQL came back", i)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("replicas ready %v after PostgreSQL was back", time.Since(startAt).Round(time.Millisecond))

	// Service resumes without restarting the gateways. The pools may hand
	// out a connection the restart broke; that costs at most one 503 per
	// stale connection, so retry briefly and count.
	var early []string
	var w answer
	for {
		w = fencedWrite(bases[1], a.LeaseID, "/r", "A after outage")
		if w.code == http.StatusOK || time.Since(startAt) > 25*time.Second {
			break
		}
		early = append(early, w.String())
		time.Sleep(100 * time.Millisecond)
	}
	if w.code != http.StatusOK {
		t.Fatalf("A's lease (granted before the outage, TTL 1 min) after PostgreSQL came back: %v", w)
	}
	if len(early) > 0 {
		t.Logf("%d write(s) refused after /readyz turned green, before the first went through: %q", len(early), early)
	}
	for i, p := range ps {
		if !alive(p) {
			t.Fatalf("replica %d exited: %v\n%s", i, p.err, p.output())
		}
	}
	// Nothing granted during the outage: the first grant of "fresh" is token 1.
	if f, g := grant(bases[1], "fresh", "X", time.Second, 0); g.code != http.StatusCreated || f.Token != 1 {
		t.Errorf("first grant of a resource only tried during the outage: %v (token %d), want token 1", g, f.Token)
	}
	// A hands over to B; A is then fenced.
	if r := release(bases[0], a.LeaseID); r.code != http.StatusNoContent {
		t.Errorf("release A: %v", r)
	}
	b, ans := grant(bases[1], "r", "B", time.Minute, 5*time.Second)
	if ans.code != http.StatusCreated || b.Token <= a.Token {
		t.Fatalf("B after the outage: %v (token %d, A had %d)", ans, b.Token, a.Token)
	}
	want409(t, "A after B's grant", fencedWrite(bases[0], a.LeaseID, "/r", "A stale"), "stale_token")
	if w := fencedWrite(bases[0], b.LeaseID, "/r", "B"); w.code != http.StatusOK {
		t.Errorf("B's write: %v", w)
	}
	for _, body := range []string{"A during outage", "A stale"} {
		if up.received(body) {
			t.Errorf("%q reached the upstream", body)
		}
	}
	c.log(t)
	for k, n := range c.outcomes {
		if strings.HasPrefix(k, "before") && !strings.HasSuffix(k, " 201") && !strings.HasSuffix(k, " 200") && !strings.Contains(k, "lease_held") {
			t.Errorf("before the outage: %d × %q", n, k)
		}
	}
	c.ledger.check(t, stopAt, startAt, bases)
	up.checkOrder(t)
}
