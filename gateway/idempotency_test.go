package gateway

import (
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

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// keyedEnv is a gateway on a bolt store with idempotency on, in front of a
// real upstream that counts how often each key was applied.
type keyedEnv struct {
	url     string
	svc     *tokens.Service
	mu      sync.Mutex
	applied map[string]int
	handle  func(w http.ResponseWriter, r *http.Request) // the upstream's behaviour
}

func newKeyedEnv(t *testing.T, forwardTimeout time.Duration, idem bool) *keyedEnv {
	return newKeyedEnvAuth(t, forwardTimeout, idem, nil)
}

// bearerNames authenticates "Authorization: Bearer NAME" as the worker NAME.
type bearerNames struct{}

func (bearerNames) Authenticate(r *http.Request) (*Principal, error) {
	name, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || name == "" {
		return nil, ErrUnauthenticated
	}
	return &Principal{Name: name, Role: RoleWorker}, nil
}

func (bearerNames) Allow(*Principal) (bool, time.Duration) { return true, 0 }

func newKeyedEnvAuth(t *testing.T, forwardTimeout time.Duration, idem bool, auth Authenticator) *keyedEnv {
	t.Helper()
	env := &keyedEnv{applied: map[string]int{}}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env.mu.Lock()
		handle := env.handle
		env.mu.Unlock()
		if handle != nil {
			handle(w, r)
			return
		}
		env.apply(r)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/lines/1")
		w.Header().Set("Set-Cookie", "session=secret")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"line":1}`)
	}))
	t.Cleanup(up.Close)
	store, err := bolt.Open(t.TempDir()+"/fencegw.db", bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	env.svc = tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: log, DrainPeriod: 100 * time.Millisecond})
	u, _ := url.Parse(up.URL)
	cfg := Config{Logger: log, Upstreams: map[string]*url.URL{"up": u}, ForwardTimeout: forwardTimeout, Auth: auth}
	if idem {
		cfg.Idempotency = tokens.NewIdempotency(tokens.IdempotencyConfig{Store: store, InFlight: forwardTimeout + DefaultBodyTimeout, MaxBody: 16})
	}
	g := New(env.svc, cfg)
	srv := httptest.NewServer(g)
	t.Cleanup(func() {
		g.Close()
		srv.Close()
		_ = store.Close()
	})
	env.url = srv.URL
	return env
}

func (env *keyedEnv) apply(r *http.Request) {
	env.mu.Lock()
	env.applied[r.Header.Get(HeaderIdempotencyKey)]++
	env.mu.Unlock()
}

func (env *keyedEnv) count(key string) int {
	env.mu.Lock()
	defer env.mu.Unlock()
	return env.applied[`"`+key+`"`]
}

func (env *keyedEnv) lease(t *testing.T, resource string) tokens.Lease {
	t.Helper()
	l, err := env.svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: resource, Holder: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// write sends a keyed write (key "" : no header) and returns the answer,
// its body and, for a gateway problem, its code.
func (env *keyedEnv) write(t *testing.T, lease, key, body string, header ...string) (*http.Response, string, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, env.url+"/v1/proxy/up/lines?x=1", strings.NewReader(body))
	req.Header.Set(HeaderLease, lease)
	if key != "" {
		req.Header.Set(HeaderIdempotencyKey, `"`+key+`"`)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var p struct{ Code string }
	if resp.Header.Get("Content-Type") == problemContentType {
		_ = json.Unmarshal(b, &p)
	}
	return resp, string(b), p.Code
}

func TestIdempotentWriteIsReplayed(t *testing.T) {
	t.Parallel()
	env := newKeyedEnv(t, 5*time.Second, true)
	l := env.lease(t, "acct/1")
	first, body, _ := env.write(t, l.ID, "k1", `{"amount":5}`)
	if first.StatusCode != http.StatusCreated || body != `{"line":1}` || first.Header.Get(HeaderReplayed) != "" {
		t.Fatalf("first attempt: %d %q replayed=%q", first.StatusCode, body, first.Header.Get(HeaderReplayed))
	}
	again, body, _ := env.write(t, l.ID, "k1", `{"amount":5}`)
	if again.StatusCode != http.StatusCreated || body != `{"line":1}` || again.Header.Get(HeaderReplayed) != "true" ||
		again.Header.Get("Location") != "/lines/1" || again.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("retry: %d %q headers %v; want the recorded 201, replayed", again.StatusCode, body, again.Header)
	}
	if again.Header.Get("Set-Cookie") != "" {
		t.Fatalf("a replay carried Set-Cookie %q: session secrets are not recorded", again.Header.Get("Set-Cookie"))
	}
	if n := env.count("k1"); n != 1 {
		t.Fatalf("upstream applied k1 %d times, want 1", n)
	}
	// Another body under the same key: 422, nothing forwarded.
	if resp, _, code := env.write(t, l.ID, "k1", `{"amount":6}`); resp.StatusCode != http.StatusUnprocessableEntity || code != tokens.CodeKeyMismatch {
		t.Fatalf("same key, other body: %d %s, want 422 %s", resp.StatusCode, code, tokens.CodeKeyMismatch)
	}
	// Another key is another write.
	if resp, _, _ := env.write(t, l.ID, "k2", `{"amount":5}`); resp.StatusCode != http.StatusCreated || env.count("k2") != 1 {
		t.Fatalf("another key: %d, applied %d", resp.StatusCode, env.count("k2"))
	}
	// Under a newer lease of the same resource the key is still applied
	// once; the superseded lease is refused whatever its key.
	if _, err := env.svc.Release(t.Context(), l.ID, ""); err != nil {
		t.Fatal(err)
	}
	l2 := env.lease(t, "acct/1")
	if resp, _, _ := env.write(t, l2.ID, "k1", `{"amount":5}`); resp.StatusCode != http.StatusCreated || resp.Header.Get(HeaderReplayed) != "true" {
		t.Fatalf("retry under a newer lease: %d replayed=%q, want the recorded answer", resp.StatusCode, resp.Header.Get(HeaderReplayed))
	}
	if resp, _, code := env.write(t, l.ID, "k1", `{"amount":5}`); resp.StatusCode != http.StatusConflict || code != tokens.CodeStaleToken {
		t.Fatalf("retry under the superseded lease: %d %s, want 409 stale_token", resp.StatusCode, code)
	}
	if n := env.count("k1"); n != 1 {
		t.Fatalf("upstream applied k1 %d times, want 1", n)
	}
	// A long answer is recorded without its body.
	env.mu.Lock()
	env.handle = func(w http.ResponseWriter, r *http.Request) {
		env.apply(r)
		_, _ = io.WriteString(w, strings.Repeat("z", 100))
	}
	env.mu.Unlock()
	if resp, body, _ := env.write(t, l2.ID, "long", "x"); resp.StatusCode != 200 || len(body) != 100 {
		t.Fatalf("long answer: %d, %d bytes", resp.StatusCode, len(body))
	}
	if resp, body, _ := env.write(t, l2.ID, "long", "x"); resp.StatusCode != 200 || body != "" || resp.Header.Get(HeaderBodyOmitted) != "true" {
		t.Fatalf("replay of a long answer: %d %q omitted=%q", resp.StatusCode, body, resp.Header.Get(HeaderBodyOmitted))
	}
}

// The seed story: the write times out at the gateway (504) but lands; its
// retry with the key is not forwarded again.
func TestIdempotentTimeoutIsNeverForwardedTwice(t *testing.T) {
	t.Parallel()
	env := newKeyedEnv(t, 200*time.Millisecond, true)
	landed := make(chan struct{})
	env.handle = func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(400 * time.Millisecond) // past the forward timeout
		env.apply(r)
		close(landed)
	}
	l := env.lease(t, "acct/2")
	if resp, _, code := env.write(t, l.ID, "charge-1", "5"); resp.StatusCode != http.StatusGatewayTimeout || code != problems.CodeUpstreamTimeout {
		t.Fatalf("first attempt: %d %s, want 504", resp.StatusCode, code)
	}
	<-landed
	for range 2 {
		if resp, _, code := env.write(t, l.ID, "charge-1", "5"); resp.StatusCode != http.StatusConflict || code != tokens.CodeOutcomeUnknown {
			t.Fatalf("retry of an unknown outcome: %d %s, want 409 %s", resp.StatusCode, code, tokens.CodeOutcomeUnknown)
		}
	}
	if n := env.count("charge-1"); n != 1 {
		t.Fatalf("upstream applied the charge %d times, want 1", n)
	}
}

func TestIdempotentInProgress(t *testing.T) {
	t.Parallel()
	env := newKeyedEnv(t, 5*time.Second, true)
	arrived, release := make(chan struct{}), make(chan struct{})
	env.handle = func(w http.ResponseWriter, r *http.Request) {
		env.apply(r)
		close(arrived)
		<-release
		w.WriteHeader(http.StatusAccepted)
	}
	l := env.lease(t, "acct/3")
	done := make(chan int)
	go func() {
		resp, _, _ := env.write(t, l.ID, "slow", "1")
		done <- resp.StatusCode
	}()
	<-arrived
	resp, _, code := env.write(t, l.ID, "slow", "1")
	if resp.StatusCode != http.StatusConflict || code != tokens.CodeKeyInProgress || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("retry while in flight: %d %s Retry-After %q, want 409 %s with Retry-After 1", resp.StatusCode, code, resp.Header.Get("Retry-After"), tokens.CodeKeyInProgress)
	}
	close(release)
	if st := <-done; st != http.StatusAccepted {
		t.Fatalf("first attempt: %d", st)
	}
	if resp, _, _ := env.write(t, l.ID, "slow", "1"); resp.StatusCode != http.StatusAccepted || resp.Header.Get(HeaderReplayed) != "true" {
		t.Fatalf("retry after the answer: %d replayed=%q", resp.StatusCode, resp.Header.Get(HeaderReplayed))
	}
	if n := env.count("slow"); n != 1 {
		t.Fatalf("applied %d times, want 1", n)
	}
}

// An upstream that says it did not process the write (503) does not use
// up the key.
func TestIdempotentUnprocessedIsForgotten(t *testing.T) {
	t.Parallel()
	env := newKeyedEnv(t, 5*time.Second, true)
	busy := true
	env.handle = func(w http.ResponseWriter, r *http.Request) {
		if busy {
			busy = false
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		env.apply(r)
		w.WriteHeader(http.StatusOK)
	}
	l := env.lease(t, "acct/4")
	if resp, _, _ := env.write(t, l.ID, "k", "1"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first attempt: %d, want the upstream's 503", resp.StatusCode)
	}
	if resp, _, _ := env.write(t, l.ID, "k", "1"); resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderReplayed) != "" {
		t.Fatalf("retry after a 503: %d replayed=%q, want forwarded", resp.StatusCode, resp.Header.Get(HeaderReplayed))
	}
}

func TestIdempotencyKeyValidation(t *testing.T) {
	t.Parallel()
	env := newKeyedEnv(t, 5*time.Second, true)
	l := env.lease(t, "acct/5")
	for _, tc := range []struct {
		name   string
		values []string
	}{
		{"unquoted", []string{"abc"}},
		{"empty", []string{`""`}},
		{"too long", []string{`"` + strings.Repeat("a", 256) + `"`}},
		{"parameters", []string{`"abc";x=1`}},
		{"twice", []string{`"a"`, `"b"`}},
		{"non-ASCII", []string{"\"caf\xc3\xa9\""}},
		{"bad escape", []string{`"a\b"`}},
		{"unclosed", []string{`"abc`}},
	} {
		var h []string
		for _, v := range tc.values {
			h = append(h, HeaderIdempotencyKey, v)
		}
		resp, body, code := env.write(t, l.ID, "", "1", h...)
		if resp.StatusCode != http.StatusBadRequest || code != tokens.CodeInvalidRequest || !strings.Contains(body, HeaderIdempotencyKey) {
			t.Errorf("%s: %d %s %s, want 400 invalid_request naming %s", tc.name, resp.StatusCode, code, body, HeaderIdempotencyKey)
		}
	}
	if n := len(env.applied); n != 0 {
		t.Fatalf("bad keys reached the upstream: %v", env.applied)
	}
	if resp, _, _ := env.write(t, l.ID, "", "1", HeaderIdempotencyKey, ` "a\"b\\c" `); resp.StatusCode != http.StatusCreated {
		t.Fatalf("a key with escapes: %d, want forwarded", resp.StatusCode)
	}
}

func TestIdempotencyKeyRefusedWhenOff(t *testing.T) {
	t.Parallel()
	env := newKeyedEnv(t, 5*time.Second, false)
	l := env.lease(t, "acct/6")
	if resp, _, code := env.write(t, l.ID, "k", "1"); resp.StatusCode != http.StatusBadRequest || code != tokens.CodeInvalidRequest {
		t.Fatalf("keyed write without idempotency configured: %d %s, want 400", resp.StatusCode, code)
	}
	if resp, _, _ := env.write(t, l.ID, "", "1"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("unkeyed write: %d", resp.StatusCode)
	}
}

// A write without the header pays nothing for the feature at hook 1.
func TestUnkeyedWriteAllocatesNothingForKeys(t *testing.T) {
	g := &Gateway{}
	r := httptest.NewRequest(http.MethodPost, "/v1/proxy/up/a", strings.NewReader("x"))
	w := httptest.NewRecorder()
	var wf writeFields
	readWriteFields(r.Header, nil, &wf)
	allocs := testing.AllocsPerRun(100, func() {
		if k, ok := g.keyedWrite(w, r, &wf); k != nil || !ok {
			t.Fatal("unkeyed write treated as keyed")
		}
	})
	if allocs != 0 {
		t.Fatalf("keyedWrite allocates %v times for a write without a key, want 0", allocs)
	}
}

// With authentication a key is the principal's: another principal's write
// with the same key on the same resource is its own first attempt, never
// another caller's recorded answer.
func TestIdempotencyKeyScopedByPrincipal(t *testing.T) {
	t.Parallel()
	env := newKeyedEnvAuth(t, 5*time.Second, true, bearerNames{})
	acquire := func(owner string) tokens.Lease {
		l, err := env.svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: "acct/7", Holder: owner, Owner: owner, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	alice := acquire("alice")
	if resp, _, _ := env.write(t, alice.ID, "shared", "1", "Authorization", "Bearer alice"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("alice: %d", resp.StatusCode)
	}
	if _, err := env.svc.Release(t.Context(), alice.ID, "alice"); err != nil {
		t.Fatal(err)
	}
	bob := acquire("bob")
	resp, _, _ := env.write(t, bob.ID, "shared", "1", "Authorization", "Bearer bob")
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(HeaderReplayed) != "" {
		t.Fatalf("bob with alice's key: %d replayed=%q, want his own first attempt", resp.StatusCode, resp.Header.Get(HeaderReplayed))
	}
	if n := env.count("shared"); n != 2 {
		t.Fatalf("the key was applied %d times, want once per principal (2)", n)
	}
	if resp, _, _ := env.write(t, bob.ID, "shared", "1", "Authorization", "Bearer bob"); resp.Header.Get(HeaderReplayed) != "true" {
		t.Fatalf("bob's retry: %d replayed=%q", resp.StatusCode, resp.Header.Get(HeaderReplayed))
	}
}
