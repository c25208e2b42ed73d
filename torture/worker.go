package torture

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// WorkerConfig configures one worker process (or one in-process group).
type WorkerConfig struct {
	Name       string        `json:"name"`       // unique in the run: prefixes holders and write ids
	Gateways   []string      `json:"gateways"`   // base URLs of the replicas
	Upstream   string        `json:"upstream"`   // the upstream's name in the gateway
	Resources  []string      `json:"resources"`  // names to contend for
	Goroutines int           `json:"goroutines"` // concurrent workers
	TTL        time.Duration `json:"ttl"`
	Wait       time.Duration `json:"wait"` // wait_ms of an acquire
	// StallPermille of the writes are preceded by a sleep past the TTL (a
	// pause that is not a process stop, for in-process workers).
	StallPermille int           `json:"stall_permille"`
	Timeout       time.Duration `json:"timeout"`    // per HTTP request
	MaxWrites     int           `json:"max_writes"` // writes per lease: 1..MaxWrites
	Seed          uint64        `json:"seed"`
	// Keys are the API keys of the goroutines, one each, named like the
	// goroutine's holder (Name.i) in the gateway's auth file. Empty: no
	// authentication, and no thieves.
	Keys []string `json:"keys,omitempty"`
	// TheftPermille of a goroutine's rounds (with Keys) are a theft
	// instead of a lease of its own: a write, then a renewal or a release,
	// with the lease id of another goroutine's current lease, which the
	// gateway must refuse (403 lease_not_owned).
	TheftPermille int `json:"theft_permille,omitempty"`
	// RouteTheftPermille of a goroutine's grants are followed by a write
	// under that (live, own) lease to another resource's path, which the
	// gateway's route bindings must refuse (403 resource_mismatch). It
	// needs the gateway started with WritePathRoute.
	RouteTheftPermille int `json:"route_theft_permille,omitempty"`
	// SlowBodyPermille of the writes send half their body, stop for
	// between SlowBodyMin and SlowBodyMax, then send the rest (a slow
	// client: the gateway admits the write when its head arrives).
	SlowBodyPermille int           `json:"slow_body_permille,omitempty"`
	SlowBodyMin      time.Duration `json:"slow_body_min,omitempty"`
	SlowBodyMax      time.Duration `json:"slow_body_max,omitempty"`
}

// WritePath is the path, below the upstream, of the writes to resource:
// /w/ and the resource name, whose characters need no escaping.
func WritePath(resource string) string { return "/w/" + resource }

// WritePathRoute is the --route that binds upstream's write paths to their
// resources (resources are made of three segments: torture/NONCE/NN).
func WritePathRoute(upstream string) string { return upstream + "/w/{a}/{b}/{c}={a}/{b}/{c}" }

// Recorder receives a worker's observations; it must be safe for
// concurrent use.
type Recorder interface {
	Grant(Grant)
	Write(Write)
	LeaseOp(LeaseOp)
}

// RunWorkers runs cfg.Goroutines workers until ctx ends.
func RunWorkers(ctx context.Context, cfg WorkerConfig, rec Recorder) {
	transport := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: cfg.Goroutines * 2, IdleConnTimeout: 30 * time.Second}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: cfg.Timeout}
	b := &board{held: map[string]heldLease{}}
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Go(func() {
			w := &worker{cfg: cfg, client: client, rec: rec, board: b, holder: HolderName(cfg.Name, g),
				rng: rand.New(rand.NewPCG(cfg.Seed, uint64(g)))}
			if g < len(cfg.Keys) {
				w.key = cfg.Keys[g]
			}
			w.run(ctx)
		})
	}
	wg.Wait()
}

// HolderName is the holder of goroutine g of the worker group named group,
// and the name of its API key.
func HolderName(group string, g int) string { return fmt.Sprintf("%s.%d", group, g) }

type worker struct {
	cfg    WorkerConfig
	client *http.Client
	rec    Recorder
	board  *board
	holder string
	key    string // API key ("": no authentication)
	rng    *rand.Rand
	seq    int
	// trickle, if set, makes the next request's body a slow one
	// (nemesis_sessions.go).
	trickle time.Duration
}

// heldLease is a lease a goroutine of the group holds, as it saw the grant.
type heldLease struct {
	ID       string
	Resource string
	Token    int64
}

// board is where a group's goroutines post their current leases, for the
// thieves among them: each goroutine has its own API key, so a sibling's
// lease belongs to another principal.
type board struct {
	mu   sync.Mutex
	held map[string]heldLease // by holder
}

func (b *board) post(holder string, l heldLease) {
	b.mu.Lock()
	b.held[holder] = l
	b.mu.Unlock()
}

func (b *board) drop(holder string) {
	b.mu.Lock()
	delete(b.held, holder)
	b.mu.Unlock()
}

// pick returns a random lease held by another holder than thief.
func (b *board) pick(rng *rand.Rand, thief string) (heldLease, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ls []heldLease
	for h, l := range b.held {
		if h != thief {
			ls = append(ls, l)
		}
	}
	if len(ls) == 0 {
		return heldLease{}, false
	}
	slices.SortFunc(ls, func(a, b heldLease) int { return strings.Compare(a.ID, b.ID) }) // the map's order is random
	return ls[rng.IntN(len(ls))], true
}

type answer struct {
	status   int
	code     string
	body     []byte
	replayed bool
}

func (w *worker) do(ctx context.Context, method, url string, body []byte, header ...string) answer {
	pause := w.trickle
	w.trickle = 0
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return answer{}
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if w.key != "" {
		req.Header.Set("Authorization", "Bearer "+w.key)
	}
	var resp *http.Response
	if pause > 0 {
		resp, err = w.doTrickle(req, body, pause) // worker_slow.go
	} else {
		resp, err = w.client.Do(req)
	}
	if err != nil {
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	a := answer{status: resp.StatusCode, body: b, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if resp.StatusCode >= 300 {
		var p struct {
			Code string `json:"code"`
		}
		_ = json.Unmarshal(b, &p)
		a.code = p.Code
	}
	return a
}

// sleep waits d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (w *worker) run(ctx context.Context) {
	cfg := w.cfg
	for ctx.Err() == nil {
		if w.key != "" && w.rng.IntN(1000) < cfg.TheftPermille && w.steal(ctx) {
			continue
		}
		res := cfg.Resources[w.rng.IntN(len(cfg.Resources))]
		lease, granted, ok := w.acquire(ctx, res)
		if !ok {
			sleep(ctx, time.Duration(5+w.rng.IntN(30))*time.Millisecond)
			continue
		}
		if len(cfg.Resources) > 1 && w.rng.IntN(1000) < cfg.RouteTheftPermille {
			w.routeTheft(ctx, res, lease.LeaseID, lease.Token)
		}
		release := w.rng.IntN(2) == 0
	writes:
		for range 1 + w.rng.IntN(max(cfg.MaxWrites, 1)) {
			switch p := w.rng.IntN(1000); {
			case p < cfg.StallPermille:
				sleep(ctx, cfg.TTL+time.Duration(w.rng.Int64N(int64(cfg.TTL)))) // stall past the TTL
			case p < 250:
				sleep(ctx, time.Duration(w.rng.Int64N(int64(cfg.TTL/3))))
			}
			if ctx.Err() != nil {
				break
			}
			if cfg.SlowBodyPermille > 0 && w.rng.IntN(1000) < cfg.SlowBodyPermille {
				w.slowWrite(ctx, res, lease, granted) // worker_slow.go
				continue
			}
			w.seq++
			id := w.holder + "." + strconv.Itoa(w.seq)
			// Every other write carries its id as its Idempotency-Key, and an
			// answer that leaves its outcome open is retried with it, on
			// any replica; if the lease ended meanwhile, under a new lease
			// of the resource (the key's scope is the resource). The
			// gateway must let it reach the upstream at most once
			// (RuleKeyOnce).
			var a answer
			open := false
			for attempt := 1; ; attempt++ {
				gi := w.rng.IntN(len(cfg.Gateways))
				late := time.Since(granted) >= cfg.TTL
				sent := now()
				a = w.do(context.WithoutCancel(ctx), "POST", cfg.Gateways[gi]+"/v1/proxy/"+cfg.Upstream+WritePath(res), []byte(id),
					"Fencing-Lease", lease.LeaseID, "Content-Type", "text/plain", HeaderReplica, strconv.Itoa(gi),
					"Idempotency-Key", `"`+id+`"`)
				if a.status >= 200 && a.status < 300 && w.rng.IntN(1000) < lostAnswerPermille {
					// The answer is lost on the way back (the worker's
					// connection broke after the gateway answered): to the
					// worker the outcome is open, and its retry must be
					// answered from the gateway's record.
					a = answer{}
				}
				w.rec.Write(Write{ID: id, Resource: res, Token: lease.Token, Status: a.status, Code: a.code, Sent: sent, Returned: now(), Late: late,
					Keyed: true, Attempt: attempt, Replayed: a.replayed})
				if attempt >= keyRetries+1 || ctx.Err() != nil {
					break
				}
				if open && staleCodes[a.code] {
					// Our lease ended while the write's outcome was open.
					// The resource drains after the open outcome; keep asking.
					w.board.drop(w.holder)
					var next leaseRef
					var at time.Time
					ok := false
					for end := time.Now().Add(w.cfg.Timeout); !ok && ctx.Err() == nil && time.Now().Before(end); {
						if next, at, ok = w.acquire(ctx, res); !ok {
							sleep(ctx, 100*time.Millisecond)
						}
					}
					if !ok {
						a = answer{status: 0} // still open: give the resource up below
						break
					}
					lease, granted = next, at
					continue
				}
				if open = unknownOutcome(a.status) || a.code == codeKeyInProgress; !open {
					break
				}
				sleep(ctx, time.Duration(20+w.rng.IntN(80))*time.Millisecond)
			}
			switch {
			case a.status >= 200 && a.status < 300:
			case unknownOutcome(a.status) || a.code == codeOutcomeUnknown || a.code == codeKeyInProgress:
				release = true // outcome unknown: give the resource up
				break writes
			default:
				release = false
				break writes
			}
		}
		if release && ctx.Err() == nil {
			w.do(ctx, "DELETE", cfg.Gateways[w.rng.IntN(len(cfg.Gateways))]+"/v1/leases/"+lease.LeaseID, nil)
		}
		w.board.drop(w.holder)
	}
}

// leaseRef is a lease as a worker holds it.
type leaseRef struct {
	LeaseID string `json:"lease_id"`
	Token   int64  `json:"token"`
}

// acquire takes a lease on res on a random replica, records the grant and
// posts it on the board.
func (w *worker) acquire(ctx context.Context, res string) (leaseRef, time.Time, bool) {
	cfg := w.cfg
	gi := w.rng.IntN(len(cfg.Gateways))
	req, _ := json.Marshal(map[string]any{"resource": res, "holder": w.holder, "ttl_ms": cfg.TTL.Milliseconds(), "wait_ms": cfg.Wait.Milliseconds()})
	a := w.do(ctx, "POST", cfg.Gateways[gi]+"/v1/leases", req, "Content-Type", "application/json")
	if a.status != http.StatusCreated {
		return leaseRef{}, time.Time{}, false
	}
	granted := time.Now() // monotonic: the worker's own view of its TTL
	var lease leaseRef
	if err := json.Unmarshal(a.body, &lease); err != nil || lease.LeaseID == "" {
		return leaseRef{}, time.Time{}, false
	}
	w.rec.Grant(Grant{Resource: res, Token: lease.Token, Holder: w.holder, LeaseID: lease.LeaseID, Returned: now()})
	w.board.post(w.holder, heldLease{ID: lease.LeaseID, Resource: res, Token: lease.Token})
	return lease, granted, true
}

// lostAnswerPermille of the answered writes are treated by the worker as
// lost (no answer), so that retries reach the gateway's replays too.
const lostAnswerPermille = 30

// keyRetries is how many times a keyed write whose outcome is open is
// retried with its key.
const keyRetries = 3

// Problem codes of keyed retries.
const (
	codeKeyInProgress  = "idempotency_key_in_progress"
	codeOutcomeUnknown = "idempotency_outcome_unknown"
)

// steal takes the lease id of another goroutine's current lease (another
// principal's) and sends a write with it, then renews or releases it. A
// correct gateway refuses all of it (403 lease_not_owned) and forwards
// nothing. It returns false if no other goroutine holds a lease.
func (w *worker) steal(ctx context.Context) bool {
	l, ok := w.board.pick(w.rng, w.holder)
	if !ok {
		return false
	}
	cfg := w.cfg
	w.seq++
	id := w.holder + "." + strconv.Itoa(w.seq)
	gi := w.rng.IntN(len(cfg.Gateways))
	sent := now()
	a := w.do(context.WithoutCancel(ctx), "POST", cfg.Gateways[gi]+"/v1/proxy/"+cfg.Upstream+WritePath(l.Resource), []byte(id),
		"Fencing-Lease", l.ID, "Content-Type", "text/plain", HeaderReplica, strconv.Itoa(gi))
	w.rec.Write(Write{ID: id, Resource: l.Resource, Token: l.Token, Status: a.status, Code: a.code, Sent: sent, Returned: now(),
		LeaseID: l.ID, By: w.holder})
	if ctx.Err() != nil {
		return true
	}
	op := LeaseOp{Op: OpRenew, LeaseID: l.ID, By: w.holder, Resource: l.Resource}
	base := cfg.Gateways[w.rng.IntN(len(cfg.Gateways))] + "/v1/leases/" + l.ID
	op.Sent = now()
	if w.rng.IntN(2) == 0 {
		a = w.do(context.WithoutCancel(ctx), "POST", base+"/renew", []byte("{}"), "Content-Type", "application/json")
	} else {
		op.Op = OpRelease
		a = w.do(context.WithoutCancel(ctx), "DELETE", base, nil)
	}
	op.Status, op.Code, op.Returned = a.status, a.code, now()
	w.rec.LeaseOp(op)
	return true
}

// routeTheft sends a write under the goroutine's own live lease of res to
// the path of another resource. A gateway with route bindings refuses it
// (403 resource_mismatch) and forwards nothing.
func (w *worker) routeTheft(ctx context.Context, res, leaseID string, token int64) {
	cfg := w.cfg
	other := cfg.Resources[w.rng.IntN(len(cfg.Resources))]
	for other == res {
		other = cfg.Resources[w.rng.IntN(len(cfg.Resources))]
	}
	w.seq++
	id := w.holder + "." + strconv.Itoa(w.seq)
	gi := w.rng.IntN(len(cfg.Gateways))
	sent := now()
	a := w.do(context.WithoutCancel(ctx), "POST", cfg.Gateways[gi]+"/v1/proxy/"+cfg.Upstream+WritePath(other), []byte(id),
		"Fencing-Lease", leaseID, "Content-Type", "text/plain", HeaderReplica, strconv.Itoa(gi))
	w.rec.Write(Write{ID: id, Resource: res, Token: token, Status: a.status, Code: a.code, Sent: sent, Returned: now(), Route: other})
}

// memRecorder collects observations in memory.
type memRecorder struct {
	mu     sync.Mutex
	grants []Grant
	writes []Write
	ops    []LeaseOp
}

func (m *memRecorder) Grant(g Grant)     { m.mu.Lock(); m.grants = append(m.grants, g); m.mu.Unlock() }
func (m *memRecorder) Write(w Write)     { m.mu.Lock(); m.writes = append(m.writes, w); m.mu.Unlock() }
func (m *memRecorder) LeaseOp(o LeaseOp) { m.mu.Lock(); m.ops = append(m.ops, o); m.mu.Unlock() }

// record is one line of a worker process's output.
type record struct {
	Grant   *Grant   `json:"g,omitempty"`
	Write   *Write   `json:"w,omitempty"`
	LeaseOp *LeaseOp `json:"o,omitempty"`
}

// LineRecorder writes observations as JSON lines (a worker process's
// stdout, read by the parent).
type LineRecorder struct {
	mu  sync.Mutex
	enc *json.Encoder
}

// NewLineRecorder writes to w.
func NewLineRecorder(w io.Writer) *LineRecorder { return &LineRecorder{enc: json.NewEncoder(w)} }

// Grant implements Recorder.
func (l *LineRecorder) Grant(g Grant) { l.put(record{Grant: &g}) }

// Write implements Recorder.
func (l *LineRecorder) Write(w Write) { l.put(record{Write: &w}) }

// LeaseOp implements Recorder.
func (l *LineRecorder) LeaseOp(o LeaseOp) { l.put(record{LeaseOp: &o}) }

func (l *LineRecorder) put(r record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_ = l.enc.Encode(r)
}
