package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// notRecorded is every problem code that is not a refused write's, each
// with why the rejection log (which holds a refused write of every reason)
// does not hold it. Every other code of the problem table must be
// provoked below and found in the log, so a new code fails
// TestEveryWriteRefusalIsRecorded until it is put in one list or the
// other.
var notRecorded = map[string]string{
	tokens.CodeInvalidRequest: "a malformed request (a refused path or framing) is refused before any lease is read: no write was attempted under a lease",
	problems.CodeMissingLease: "no lease was presented: there is no lease, holder or token to record, only a malformed request",
	problems.CodeRequestTimeout: "the body did not arrive: a transport failure of an admitted write (it drains if part of it was sent), " +
		"not a refusal of its lease",
	problems.CodeBodyTooLarge:         "a size limit on the request, checked before or regardless of the lease",
	problems.CodeUnsupportedMediaType: "control calls only: a write's body is passed through whatever its type",
	problems.CodeMethodNotAllowed:     "CONNECT and upgrades are refused before any lease is read",
	tokens.CodeNotFound:               "control calls only (no such lease or resource): a write under an unknown lease is unknown_lease",
	problems.CodeUnknownUpstream:      "no such upstream: the write could reach nothing, and the lease is not read",
	problems.CodeUnauthorized: "no valid key: refused before any lease is read; recording it would let anyone " +
		"who reaches the gateway fill the bounded log",
	problems.CodeRateLimited: "the key's request budget is spent, checked before the lease is read; recording each " +
		"would flood the bounded log with what the limit exists to shed (counted in metrics by principal)",
	tokens.CodeTooManyLeases: "an acquire's refusal, not a write's",
	tokens.CodeLeaseHeld:     "an acquire's refusal, not a write's",
	tokens.CodeLeaseLost:     "a renewal's or release's refusal: recorded in the lease history, not this log",
	tokens.CodeKeyMismatch: "the Idempotency-Key's record refuses a reuse of the key for another request; " +
		"the lease is not judged (a client bug, not a fencing incident)",
	tokens.CodeKeyInProgress: "a retry of an admitted write whose first attempt is still in flight: " +
		"the write is not refused by its lease, the client is told to retry",
	tokens.CodeOutcomeUnknown: "a retry of an admitted write whose outcome is unknown (its drain is recorded): " +
		"never forwarded again, but not a refusal of its lease",
	problems.CodeUpstreamUnreachable: "the write was admitted and forwarded: not a refusal",
	problems.CodeUpstreamTimeout:     "the write was admitted and forwarded (its outcome is unknown and drains): not a refusal",
	tokens.CodeFenceBusy:             "fail closed: the gateway could not judge the write in time; nothing is known against the lease",
	tokens.CodeFenceLost:             "fail closed: the replica could not prove its fence; the write is not judged stale",
	tokens.CodeStoreUnavailable: "fail closed: the store could not be asked, and it is where the log lives; " +
		"counted in metrics",
	problems.CodeShuttingDown:  "/readyz only: a write is not refused with it",
	problems.CodeInternalError: "a bug in the gateway, logged with its cause",
}

// clock is a test clock for the store and the service.
type clock struct{ off atomic.Int64 }

func (c *clock) now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// expire moves the clock past a lease of ttl acquired now.
func (c *clock) expire(ttl time.Duration) { c.off.Add(int64(ttl + time.Second)) }

// narrowable is an Authenticator whose keys a test can change between
// requests (an auth file replaced under live leases).
type narrowable struct {
	mu   sync.Mutex
	keys map[string]Principal
}

func (k *narrowable) set(key string, p Principal) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys[key] = p
}

func (k *narrowable) Authenticate(r *http.Request) (*Principal, error) {
	key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	k.mu.Lock()
	defer k.mu.Unlock()
	if p, ok := k.keys[key]; ok {
		p.Resources = slices.Clone(p.Resources)
		return &p, nil
	}
	return nil, ErrUnauthenticated
}

func (k *narrowable) Allow(*Principal) (bool, time.Duration) { return true, 0 }

// Every refusal a fenced write can get under a lease is recorded in the
// rejection log, with the presenting key's principal; the codes that are
// not recorded are listed above with their reason. The list of codes is
// the problem table's, so it is complete by construction.
func TestEveryWriteRefusalIsRecorded(t *testing.T) {
	up := newRecorder(t)
	var clk clock
	store, err := bolt.Open(t.TempDir()+"/fencegw.db", bolt.Options{Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	keys := &narrowable{keys: map[string]Principal{
		"k1": {Name: "worker-one", Role: RoleWorker, Resources: []string{"r:"}},
		"k2": {Name: "worker-two", Role: RoleWorker},
	}}
	target, _ := url.Parse(up.URL)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc := tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: log, Now: clk.now, DrainPeriod: time.Minute})
	g := New(svc, Config{
		Upstreams: map[string]*url.URL{"svc": target},
		Auth:      keys,
		Logger:    log,
		// Every write goes to its own resource's path, so only the lease
		// under test for another resource is refused by the route.
		Routes: []*Route{mustRoute(t, "svc/rec/{res}/**={res}")},
	})
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(Listener(srv, ln, nil)) }()
	t.Cleanup(func() {
		g.Close()
		_ = srv.Close()
	})
	base := "http://" + ln.Addr().String()
	ctx := context.Background()

	acquire := func(res, owner string) tokens.Lease {
		t.Helper()
		l, err := svc.Acquire(ctx, tokens.AcquireRequest{Resource: res, Holder: "h-" + res, Owner: owner, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// write sends a fenced write with key to res's path under lease; it
	// returns the problem code (empty for a forwarded write).
	write := func(key, lease, res string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/proxy/svc/rec/"+res+"/x", strings.NewReader("x"))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set(HeaderLease, lease)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p struct {
			Code string `json:"code"`
		}
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &p)
		return resp.StatusCode, p.Code
	}

	// refusal is a write's answer and the resource its rejection names.
	type refusal struct {
		status   int
		code     string
		resource string
	}
	refused := func(res string, status int, code string) refusal { return refusal{status, code, res} }
	// forwarded is how many writes the upstream had before the refused
	// one; a provocation that forwards a write first counts again.
	var forwarded int
	// provoke makes a write get the code, presented by worker-one (k1).
	provoke := map[string]func() refusal{
		tokens.CodeStaleToken: func() refusal {
			old := acquire("r:stale", "worker-one")
			if _, err := svc.Release(ctx, old.ID, ""); err != nil {
				t.Fatal(err)
			}
			acquire("r:stale", "worker-one")
			st, code := write("k1", old.ID, "r:stale")
			return refused("r:stale", st, code)
		},
		tokens.CodeLeaseExpired: func() refusal {
			l := acquire("r:expired", "worker-one")
			clk.expire(time.Minute)
			st, code := write("k1", l.ID, "r:expired")
			return refused("r:expired", st, code)
		},
		tokens.CodeLeaseReleased: func() refusal {
			l := acquire("r:released", "worker-one")
			if _, err := svc.Release(ctx, l.ID, ""); err != nil {
				t.Fatal(err)
			}
			st, code := write("k1", l.ID, "r:released")
			return refused("r:released", st, code)
		},
		tokens.CodeUnknownLease: func() refusal {
			st, code := write("k1", "never-granted-0123456789abcdef", "r:unknown")
			return refused("", st, code)
		},
		tokens.CodeLeaseNotOwned: func() refusal {
			l := acquire("r:theirs", "worker-two")
			st, code := write("k1", l.ID, "r:theirs")
			return refused("r:theirs", st, code)
		},
		tokens.CodeResourceMismatch: func() refusal {
			l := acquire("r:mine", "worker-one")
			acquire("r:other", "worker-one")
			st, code := write("k1", l.ID, "r:other") // r:mine's lease to r:other's path
			return refused("r:mine", st, code)
		},
		tokens.CodeForbidden: func() refusal {
			l := acquire("r:narrowed", "worker-one")
			if st, code := write("k1", l.ID, "r:narrowed"); st != http.StatusOK {
				t.Fatalf("the owner's write before its prefixes were narrowed: %d %s", st, code)
			}
			forwarded = len(up.seen())
			keys.set("k1", Principal{Name: "worker-one", Role: RoleWorker, Resources: []string{"r:n-other"}})
			defer keys.set("k1", Principal{Name: "worker-one", Role: RoleWorker, Resources: []string{"r:"}})
			st, code := write("k1", l.ID, "r:narrowed")
			return refused("r:narrowed", st, code)
		},
	}

	for _, p := range problems.All() {
		why, skip := notRecorded[p.Code]
		fn, ok := provoke[p.Code]
		switch {
		case skip && ok:
			t.Errorf("%s is both recorded and listed as not recorded (%s)", p.Code, why)
			continue
		case skip:
			if slices.Contains(tokens.RejectionCodes, p.Code) {
				t.Errorf("%s is a rejection code (tokens.RejectionCodes) but listed as not recorded", p.Code)
			}
			continue
		case !ok:
			t.Errorf("problem code %s is neither provoked here and found in the rejection log nor listed in notRecorded with why not", p.Code)
			continue
		}
		t.Run(p.Code, func(t *testing.T) {
			forwarded = len(up.seen())
			got := fn()
			if got.status != p.Status || got.code != p.Code {
				t.Fatalf("the write got %d %s, want %d %s", got.status, got.code, p.Status, p.Code)
			}
			if len(up.seen()) != forwarded {
				t.Fatalf("the refused write reached the upstream")
			}
			rejs, err := svc.Rejections(ctx, tokens.RejectionQuery{Limit: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(rejs) != 1 {
				t.Fatalf("no rejection recorded")
			}
			r := rejs[0]
			if r.Code != p.Code || r.Principal != "worker-one" || r.Resource != got.resource || r.Upstream != "svc" {
				t.Fatalf("the newest rejection is %+v, want code %s, principal worker-one, resource %q", r, p.Code, got.resource)
			}
		})
	}
	for _, code := range tokens.RejectionCodes {
		if _, ok := provoke[code]; !ok {
			t.Errorf("rejection code %s is not provoked here", code)
		}
	}
}
