package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// Sticky fences: how a replica admits steady-state writes without a
// database round trip, and stays safe when it dies.
//
// A write needs its resource's shared fence for the whole forward, so that a
// grant (which takes the exclusive fence) waits for it. Taking a session
// advisory lock per write costs four round trips and one connection per
// in-flight write. Instead a replica takes the shared advisory lock once, on
// one of a few long-lived lock sessions, keeps it across many writes, and
// admits each write on a local check of the state it read under that lock:
//
//  1. While this replica's session holds R's shared lock, no grant, release
//     or revoke of R can commit anywhere (they take the exclusive lock
//     first, see Exclusive). So the token, the current lease and its
//     released flag read under the lock stay true until the lock is given
//     up. Only expiry moves on its own: the local check judges expiry on a
//     clock that runs ahead of the database's (the database's time at the
//     read, plus the local time elapsed since before the read was sent), so
//     it declares a lease expired early, never late. A renewal on another
//     replica only makes the remembered expiry too early: the write is
//     "unsure", and is judged again on the state read from the database,
//     under the lock. Nothing is refused on memory alone.
//  2. A replica gives a fence up when another replica needs it: every
//     exclusive taker first sends NOTIFY (every 250 ms while it waits, so
//     a lost notification only delays it), each replica stops admitting
//     locally at once and unlocks when its last write under the fence has
//     finished. Writes arriving meanwhile try the lock again; a
//     pg_try_advisory_lock_shared fails while an exclusive request waits
//     (PostgreSQL queues conflicting requests behind a waiter), so grants
//     never starve behind a resource's writes. Fences are also given up when
//     idle, when the lease they remember has expired, and beyond MaxFences.
//  3. Before a write is admitted under a new fence, a presence row names the
//     lock session (pid and start time) that holds it; giving up the fence
//     deletes the row. A replica that dies, or whose session is killed,
//     frees its locks with its session but leaves the row: the next
//     exclusive taker finds a row whose session no longer exists and starts
//     a drain period of OrphanDrain, because a write that replica forwarded
//     may still land. Resources it never fenced are not held up. A write
//     whose outcome is unknown and whose drain the store could not record
//     keeps its hold (tokens/drain.go), so the fence and its row outlive
//     the write until the drain is recorded or has passed: a replica that
//     dies meanwhile leaves the row, and the orphan drain, which starts no
//     earlier than its death, covers the rest.
//  4. Each lock session is pinged every SessionCheck/10; a replica admits
//     locally only while its session was confirmed alive less than
//     SessionCheck ago, and destroys a session that fails a ping (or does
//     not answer within sessionPingTimeout: a slow answer only stops
//     admission, it does not drop the fences). The same proof is taken
//     again before every byte of an admitted write is sent (heldRef.Check,
//     which the gateway calls before each write system call to the
//     upstream): the fence was not dropped, the session that took its lock
//     is still the connected one, and a ping *sent* at S succeeded less
//     than SessionCheck ago (while a ping is only slow, the proof waits
//     for it, up to the forward's deadline). A ping sent at S that succeeded means the
//     session was alive after S, so it died at D > S, and every byte that
//     passes the proof leaves before S + SessionCheck < D + SessionCheck.
//     The next exclusive taker finds the orphan row no earlier than D and
//     drains for OrphanDrain (the drain period + SessionCheck) from then,
//     so every byte sent under a fence that was lost left at least a drain
//     period before that drain ends: the margin the drain period gives a
//     forward that timed out, whose last byte left before its timeout.
//     This bound runs from the session's death, not from the write's
//     admission, so a body that takes --body-timeout to arrive, or streams
//     for the whole forward timeout, is covered: its bytes stop at the
//     proof (the gateway resets the exchange, never completing the body).
//     A clean shutdown gives every fence up after the in-flight writes
//     drained: no orphan, no wait.
//
// The limit, which no gateway can remove: a process stopped between its
// last proof and its write system call (SIGSTOP, a VM pause, a page fault
// or preemption at the wrong instant) sends, when it runs again, bytes it
// proved it could send a moment before it stopped. The window is the code
// between the clock read in Check and the kernel's entry in write(2):
// measured at 20 ns or less (the clock's resolution; 2 cores, shared),
// against a SessionCheck of a second (go test -run '^$' -bench SendWindow
// -benchtime 200000x ./gateway/: window-ns). Only an upstream that checks
// Fencing-Token closes it. Bytes handed to the kernel before the proof failed may also
// still be in its send buffer or on the network; the reset discards what
// the kernel had not sent, and the drain period covers the rest, as for
// any write whose outcome is unknown.

// Defaults for FenceOptions fields left zero.
const (
	DefaultLockSessions = 4
	DefaultMaxFences    = 4096
	// DefaultFenceIdle: a fence without writes for this long is given up.
	// Longer keeps bursty writers off the slow path (a cold fence costs
	// three round trips); shorter narrows what a crash drains.
	DefaultFenceIdle    = 10 * time.Second
	DefaultSessionCheck = time.Second
	// DefaultExclusiveConns bounds the connections that wait for or hold an
	// exclusive fence (grants, releases, revokes in progress).
	DefaultExclusiveConns = 8
)

// FenceOptions configure a Fence.
type FenceOptions struct {
	// Sessions is the number of long-lived lock sessions (connections) that
	// hold this replica's shared fences (0: DefaultLockSessions).
	Sessions int
	// MaxFences bounds the shared advisory locks this replica holds at once
	// (0: DefaultMaxFences). PostgreSQL's lock table is shared by the whole
	// server: see docs/operations.md for sizing max_locks_per_transaction.
	// Beyond it the least recently used idle fence is given up; if none is
	// idle the write is refused as unavailable.
	MaxFences int
	// Idle: a fence without writes for this long is given up (0: DefaultFenceIdle).
	Idle time.Duration
	// SessionCheck bounds how long this replica admits writes without
	// having confirmed its lock session alive (0: DefaultSessionCheck).
	SessionCheck time.Duration
	// OrphanDrain is the drain period started when an exclusive taker finds
	// a fence left by a dead session. It must outlast a write admitted up
	// to SessionCheck after the session died: the gateway passes its drain
	// period plus SessionCheck. 0: DefaultLockTimeout.
	OrphanDrain time.Duration
	// Replica names this process in fence_presence rows (for operators).
	Replica string
	// State reads a lease and its resource's state (nil: the Store's
	// LeaseState). The Redis mode passes its own, which also checks the
	// Redis claim.
	State StateReader
}

// StateReader reads a lease and its resource's fence state, the one read
// Hold judges a write on: leaseID's lease and its resource's state as
// Store.Lease and Store.Resource would return them, read at one instant
// with the store's clock in Resource.Now, except that Resource.Lease may be
// nil when it is not leaseID's lease (the lease is then superseded
// whichever it is, and Resource.Token says by which token). ErrNotFound
// for an unknown lease id. The conformance suite (storagetest, LeaseState)
// checks it on every Store that has it.
type StateReader interface {
	LeaseState(ctx context.Context, leaseID string) (tokens.Lease, tokens.Resource, error)
}

// Fence is a tokens.Fencer on PostgreSQL advisory locks, with shared
// fences kept across writes (see the comment above). One per replica;
// Close gives every fence up.
type Fence struct {
	store    *Store
	opts     FenceOptions
	state    StateReader
	log      *slog.Logger
	channel  string
	epoch    time.Time // monotonic origin for session confirmations
	sessions []*lockSession

	mu         sync.Mutex
	byResource map[string]*heldFence
	byLease    map[string]*heldFence // the current lease of each held fence

	stop        chan struct{}
	wg          sync.WaitGroup
	closed      atomic.Bool
	listenerPID atomic.Uint32
	onFree      atomic.Pointer[func(resource string)]
	stats       FenceStats
}

// FenceStats count what the fence did, for metrics and tests.
type FenceStats struct {
	LocalAdmits atomic.Int64 // writes admitted on memory, no round trip
	Acquired    atomic.Int64 // shared fences taken
	Yielded     atomic.Int64 // shared fences given up
	Lost        atomic.Int64 // fences dropped with a lost session
}

// Stats returns the fence's counters.
func (f *Fence) Stats() *FenceStats { return &f.stats }

var _ tokens.Fencer = (*Fence)(nil)

type fenceStatus int

const (
	fenceAcquiring fenceStatus = iota
	fenceHeld
	fenceYielding // no new local admissions; unlock when inflight reaches 0
	fenceGone     // unlocked or lost; out of the maps
)

// heldFence is one resource's shared fence on one lock session. Every field
// but the immutable ones is guarded by Fence.mu.
type heldFence struct {
	resource string
	key      int64
	sess     *lockSession
	gen      uint64 // the session's generation when the lock was taken

	status   fenceStatus
	inflight int
	lastUsed time.Time
	// state was read under the lock; readStart is the local time just before
	// the read was sent (see estimate).
	state     tokens.Resource
	readStart time.Time
	haveState bool
	// settled is closed when the fence leaves fenceAcquiring or is gone.
	settled chan struct{}
	gone    chan struct{}
	// dropped is set when the fence is gone (status fenceGone), for
	// heldRef.Check, which takes no lock.
	dropped atomic.Bool
}

// NewFence starts the lock sessions and the yield listener. The Store stays
// the caller's to close, after the Fence.
func (s *Store) NewFence(ctx context.Context, opts FenceOptions) (*Fence, error) {
	if opts.Sessions <= 0 {
		opts.Sessions = DefaultLockSessions
	}
	if opts.MaxFences <= 0 {
		opts.MaxFences = DefaultMaxFences
	}
	if opts.Idle <= 0 {
		opts.Idle = DefaultFenceIdle
	}
	if opts.SessionCheck <= 0 {
		opts.SessionCheck = DefaultSessionCheck
	}
	if opts.OrphanDrain <= 0 {
		opts.OrphanDrain = DefaultLockTimeout
	}
	f := &Fence{
		store:      s,
		opts:       opts,
		state:      opts.State,
		log:        s.log,
		channel:    channelName("fencegw_fence", s.keySalt),
		epoch:      time.Now(),
		byResource: make(map[string]*heldFence),
		byLease:    make(map[string]*heldFence),
		stop:       make(chan struct{}),
	}
	if f.state == nil {
		f.state = s
	}
	for i := range opts.Sessions {
		ls := &lockSession{f: f, idx: i}
		ls.settled.Store(new(make(chan struct{})))
		if err := ls.connect(ctx); err != nil {
			f.closeSessions()
			return nil, err
		}
		f.sessions = append(f.sessions, ls)
	}
	ready := make(chan struct{})
	f.wg.Add(2 + len(f.sessions))
	for _, ls := range f.sessions {
		go ls.healthLoop()
	}
	go f.listenLoop(ready)
	go f.janitor()
	select {
	case <-ready:
	case <-ctx.Done():
		f.Close()
		return nil, tokens.Unavailable("fence listener", ctx.Err())
	}
	return f, nil
}

// Hold judges one write under leaseID and, if it is admitted, holds its
// fence (tokens.Fencer): see the comment at the top of this file for why
// the state it judges may come from memory. Every state it judges is
// judged once, here (tokens.Judge); the Service takes the verdict as it is.
func (f *Fence) Hold(ctx context.Context, leaseID string) (tokens.Verdict, error) {
	now := time.Now()
	f.mu.Lock()
	hf := f.byLease[leaseID]
	if hf != nil && hf.status == fenceHeld && hf.sess.confirmed(now, hf.gen) {
		state := hf.state
		state.Now = hf.estimate(now)
		if tokens.Judge(*state.Lease, state, state.Now) == nil {
			hf.inflight++
			f.mu.Unlock()
			f.stats.LocalAdmits.Add(1)
			return tokens.Verdict{Lease: *state.Lease, State: state, Held: &heldRef{f: f, hf: hf}}, nil
		}
		// Not admitted on memory: judged again below, on the database's
		// state, never refused on what this replica remembers.
	}
	f.mu.Unlock()
	return f.holdSlow(ctx, leaseID)
}

// holdSlow reads the lease from the database and refuses it there if it
// is refused for good; otherwise it takes the fence and judges the state
// read under it. Two reads, each judged once: the first spares a write
// that will be refused whatever happens next the fence (a lock round trip
// per stale write in a storm); the second is the one a write is admitted
// on.
func (f *Fence) holdSlow(ctx context.Context, leaseID string) (tokens.Verdict, error) {
	lease, state, err := f.state.LeaseState(ctx, leaseID)
	if err != nil {
		return tokens.Verdict{}, err
	}
	if refusal := tokens.Judge(lease, state, state.Now); refusal != nil {
		// Final: tokens never go down, a superseded or released lease stays
		// so, an expired one cannot be renewed. No fence needed to refuse.
		return tokens.Verdict{Lease: lease, State: state, Refusal: refusal}, nil
	}
	hf, err := f.hold(ctx, lease.Resource)
	if err != nil {
		return tokens.Verdict{}, err
	}
	readStart := time.Now()
	lease, state, err = f.state.LeaseState(ctx, leaseID)
	if err != nil {
		f.release(hf)
		return tokens.Verdict{}, err
	}
	f.remember(hf, state, readStart)
	if refusal := tokens.Judge(lease, state, state.Now); refusal != nil {
		// The lease ended between the reads (a grant, release or revoke
		// took the exclusive fence before this one was held).
		f.release(hf)
		return tokens.Verdict{Lease: lease, State: state, Refusal: refusal}, nil
	}
	return tokens.Verdict{Lease: *state.Lease, State: state, Held: &heldRef{f: f, hf: hf}}, nil
}

// remember keeps state, read under hf's lock, for local checks.
func (f *Fence) remember(hf *heldFence, state tokens.Resource, readStart time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if hf.status != fenceHeld && hf.status != fenceYielding {
		return
	}
	if hf.haveState && hf.state.Lease != nil && f.byLease[hf.state.Lease.ID] == hf {
		delete(f.byLease, hf.state.Lease.ID)
	}
	hf.state, hf.readStart, hf.haveState = state, readStart, true
	if state.Lease != nil && hf.status == fenceHeld {
		f.byLease[state.Lease.ID] = hf
	}
}

// estimate is the database's clock now, erring late: the database's time at
// the read plus the local time since before the read was sent, plus 0.1 %
// and a millisecond for clock rate differences.
func (hf *heldFence) estimate(now time.Time) time.Time {
	elapsed := now.Sub(hf.readStart)
	return hf.state.Now.Add(elapsed + elapsed/1000 + time.Millisecond)
}

// errFenceLimit: every fence this replica may hold is busy.
var errFenceLimit = errors.New("this replica holds the maximum number of fences, all with writes in flight")

// hold takes one in-flight reference on resource's shared fence, acquiring
// the lock if this replica does not hold it.
func (f *Fence) hold(ctx context.Context, resource string) (*heldFence, error) {
	backoff := time.Millisecond
	for {
		if f.closed.Load() {
			return nil, tokens.Unavailable("fence", errors.New("closed"))
		}
		f.mu.Lock()
		hf := f.byResource[resource]
		switch {
		case hf == nil:
			if len(f.byResource) >= f.opts.MaxFences && !f.evictIdleLocked() {
				f.mu.Unlock()
				return nil, tokens.Unavailable("fence", errFenceLimit)
			}
			hf = &heldFence{
				resource: resource,
				key:      f.store.lockKey("resource", resource),
				sess:     f.sessions[sessionIndex(resource, len(f.sessions))],
				status:   fenceAcquiring,
				inflight: 1,
				settled:  make(chan struct{}),
				gone:     make(chan struct{}),
			}
			f.byResource[resource] = hf
			f.mu.Unlock()
			ok, err := f.acquire(ctx, hf)
			if err != nil {
				return nil, err
			}
			if ok {
				return hf, nil
			}
			// An exclusive request holds or waits for the lock: a grant,
			// release or revoke is under way. Try again shortly.
			if err := sleepCtx(ctx, backoff); err != nil {
				return nil, fmt.Errorf("fence %q: %w", resource, err)
			}
			backoff = min(backoff*2, 20*time.Millisecond)
		case hf.status == fenceHeld && hf.sess.confirmed(time.Now(), hf.gen):
			hf.inflight++
			f.mu.Unlock()
			return hf, nil
		case hf.status == fenceHeld && hf.sess.gen.Load() != hf.gen:
			// Its session is gone, and the lock with it: drop it and take
			// the fence anew (the old presence row is an orphan now).
			f.stats.Lost.Add(1)
			f.dropLocked(hf)
			f.mu.Unlock()
		case hf.status == fenceHeld:
			// The session has not been confirmed alive lately: no admission
			// until its next check succeeds (or fails, and drops it).
			f.mu.Unlock()
			if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
				return nil, fmt.Errorf("fence %q: %w", resource, err)
			}
		default:
			// Acquiring: wait for the outcome. Yielding: wait until it is
			// gone, then take it anew.
			wait := hf.gone
			if hf.status == fenceAcquiring {
				wait = hf.settled
			}
			f.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, fmt.Errorf("fence %q: %w", resource, ctx.Err())
			}
		}
	}
}

func sessionIndex(resource string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(resource))
	return int(h.Sum32() % uint32(n))
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// acquire takes hf's shared lock on its session and records the presence
// row, in one round trip. false (and hf removed) if an exclusive request
// holds or waits for the lock.
func (f *Fence) acquire(ctx context.Context, hf *heldFence) (bool, error) {
	gen, err := hf.sess.acquire(ctx, hf)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil && gen != 0 && hf.sess.gen.Load() != gen {
		// The session failed right after granting the lock: the lock went
		// with it.
		err = tokens.Unavailable("postgres lock session", errors.New("lost while taking a fence"))
	}
	if err != nil || gen == 0 {
		f.dropLocked(hf)
		if err != nil {
			return false, err
		}
		return false, nil
	}
	hf.gen = gen
	hf.lastUsed = time.Now()
	f.stats.Acquired.Add(1)
	if hf.status == fenceAcquiring {
		hf.status = fenceHeld
	}
	close(hf.settled)
	hf.settled = nil
	return true, nil
}

// dropLocked takes hf out of the maps; f.mu held.
func (f *Fence) dropLocked(hf *heldFence) {
	if hf.status == fenceGone {
		return
	}
	if hf.status == fenceAcquiring && hf.settled != nil {
		close(hf.settled)
		hf.settled = nil
	}
	hf.status = fenceGone
	hf.dropped.Store(true)
	if f.byResource[hf.resource] == hf {
		delete(f.byResource, hf.resource)
	}
	if hf.haveState && hf.state.Lease != nil && f.byLease[hf.state.Lease.ID] == hf {
		delete(f.byLease, hf.state.Lease.ID)
	}
	close(hf.gone)
}

// release ends one write under hf.
func (f *Fence) release(hf *heldFence) {
	f.mu.Lock()
	defer f.mu.Unlock()
	hf.inflight--
	hf.lastUsed = time.Now()
	if hf.inflight == 0 && hf.status == fenceYielding {
		f.unlockLocked(hf)
	}
}

// yieldLocked stops local admissions under hf and unlocks it once its
// writes have finished; f.mu held.
func (f *Fence) yieldLocked(hf *heldFence) {
	if hf.status != fenceHeld {
		return
	}
	hf.status = fenceYielding
	if hf.haveState && hf.state.Lease != nil && f.byLease[hf.state.Lease.ID] == hf {
		delete(f.byLease, hf.state.Lease.ID)
	}
	if hf.inflight == 0 {
		f.unlockLocked(hf)
	}
}

// unlockLocked gives hf up in the background (one round trip on its
// session) and takes it out of the maps once the lock is gone; f.mu held.
func (f *Fence) unlockLocked(hf *heldFence) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		hf.sess.unlock(hf)
		f.stats.Yielded.Add(1)
		f.mu.Lock()
		f.dropLocked(hf)
		f.mu.Unlock()
	}()
}

// yield is called for a resource that someone wants exclusively.
func (f *Fence) yield(resource string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if hf := f.byResource[resource]; hf != nil {
		if hf.status == fenceAcquiring {
			// The acquisition is in flight: if it wins the lock the write
			// under it proceeds (the state is read under the lock), and the
			// fence is given up after it.
			f.wg.Add(1)
			go func(settled chan struct{}) {
				defer f.wg.Done()
				<-settled
				f.mu.Lock()
				f.yieldLocked(hf)
				f.mu.Unlock()
			}(hf.settled)
			return
		}
		f.yieldLocked(hf)
	}
}

// yieldAll gives up every fence (after a listener reconnect, which may have
// missed notifications, and on Close).
func (f *Fence) yieldAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, hf := range f.byResource {
		f.yieldLocked(hf)
	}
}

// evictIdleLocked gives up the least recently used fence without writes in
// flight; false if there is none. f.mu held.
func (f *Fence) evictIdleLocked() bool {
	var lru *heldFence
	for _, hf := range f.byResource {
		if hf.status == fenceHeld && hf.inflight == 0 && (lru == nil || hf.lastUsed.Before(lru.lastUsed)) {
			lru = hf
		}
	}
	if lru == nil {
		return false
	}
	// It stays in byResource until unlocked (a new fence on the resource
	// must not be taken before the old presence row is deleted), so the
	// limit may be exceeded by fences being given up, never by fences in use.
	f.yieldLocked(lru)
	return true
}

// janitor gives up idle fences and fences whose remembered lease has ended.
func (f *Fence) janitor() {
	defer f.wg.Done()
	t := time.NewTicker(max(f.opts.Idle/4, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case now := <-t.C:
			f.mu.Lock()
			for _, hf := range f.byResource {
				if hf.status != fenceHeld || hf.inflight > 0 {
					continue
				}
				ended := hf.haveState && (hf.state.Lease == nil ||
					tokens.Judge(*hf.state.Lease, hf.state, hf.estimate(now)) != nil)
				if ended || now.Sub(hf.lastUsed) >= f.opts.Idle {
					f.yieldLocked(hf)
				}
			}
			f.mu.Unlock()
		}
	}
}

// Exclusive takes the resource's exclusive fence across all replicas
// (tokens.Excluder): it asks every replica (this one too) to give up its
// shared fence, waits for the lock, and starts a drain period if a dead
// session left a presence row (see the comment at the top of this file).
// A wait cut short by ctx's deadline wraps context.DeadlineExceeded.
func (f *Fence) Exclusive(ctx context.Context, resource string) (func(), error) {
	f.yield(resource)
	if err := f.notifyYield(ctx, resource); err != nil {
		return nil, err
	}
	// Repeat the request while waiting: a replica whose listener was
	// reconnecting would otherwise keep its fence until idle.
	waitDone := make(chan struct{})
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-waitDone:
				return
			case <-t.C:
				_ = f.notifyYield(ctx, resource)
			}
		}
	}()
	l, err := f.store.exclusiveFence(ctx, resource, f.opts.OrphanDrain)
	close(waitDone)
	if err != nil {
		return nil, err
	}
	// The unlock tells every replica that the resource changed hands or
	// was freed, so that their waiting acquires try again at once.
	l.notify = &[2]string{f.channel, notifyFree + resource}
	return func() { _ = l.Unlock() }, nil
}

// Notification payloads on the fence channel: a request to give a fence up
// (the resource name alone), and news that an exclusive holder let go.
const notifyFree = "free "

// OnFree sets fn to be called (on the listener's goroutine; it must not
// block) with each resource whose exclusive lock was let go on any replica:
// a grant, release or revoke finished. The gateway wakes waiting acquires
// with it.
func (f *Fence) OnFree(fn func(resource string)) { f.onFree.Store(&fn) }

func (f *Fence) notifyYield(ctx context.Context, resource string) error {
	_, err := f.store.pool.Exec(ctx, "SELECT pg_notify($1, $2)", f.channel, resource)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("fence %q: %w", resource, ctx.Err())
		}
		return tokens.Unavailable("postgres notify", err)
	}
	return nil
}

// SessionPIDs are the backend pids of the lock sessions now connected
// (diagnostics: they are the sessions to look for in pg_locks).
func (f *Fence) SessionPIDs() []uint32 {
	var pids []uint32
	for _, ls := range f.sessions {
		ls.mu.Lock()
		if ls.conn != nil {
			pids = append(pids, ls.pid)
		}
		ls.mu.Unlock()
	}
	return pids
}

// ListenerPID is the backend pid of the session that hears requests to give
// fences up (diagnostics).
func (f *Fence) ListenerPID() uint32 { return f.listenerPID.Load() }

// Held reports how many fences this replica holds (tests, metrics).
func (f *Fence) Held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.byResource)
}

// Close gives every fence up (call it after in-flight writes have drained:
// a fence with writes in flight is unlocked when they finish, or left to
// the database if they do not finish within a few seconds), then closes the
// sessions.
func (f *Fence) Close() {
	if f.closed.Swap(true) {
		return
	}
	f.yieldAll()
	deadline := time.Now().Add(5 * time.Second)
	for f.Held() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(f.stop)
	f.wg.Wait()
	f.closeSessions()
	// A fence whose writes did not finish in time went with its session:
	// dropped, so that those writes see it lost (heldRef.Lost), as after
	// a session's failure (lockSession.fail).
	f.mu.Lock()
	for _, hf := range f.byResource {
		if hf.status != fenceAcquiring {
			f.dropLocked(hf)
		}
	}
	f.mu.Unlock()
}

func (f *Fence) closeSessions() {
	for _, ls := range f.sessions {
		ls.close()
	}
}
