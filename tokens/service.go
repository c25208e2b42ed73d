package tokens

// The Service: its configuration, the safety argument of the fence rules
// (on Service), and the reads it passes to the store.

import (
	"context"
	"log/slog"
	"time"
)

// Defaults for Config fields left zero.
const (
	DefaultGrantWait   = 10 * time.Second
	DefaultDrainPeriod = 30 * time.Second
)

// Config wires a Service.
type Config struct {
	Store Store
	// Exactly one of Locker and Fencer is set: Locker in the embedded
	// mode, which locks per write; Fencer in the replicated (PostgreSQL)
	// modes, whose writes it admits. Grants, and with a Fencer releases
	// and revokes, take the exclusive side of whichever is set. New
	// panics unless exactly one is.
	Locker Locker
	Fencer Fencer
	// Now is the gateway's clock; nil means time.Now. Stores that measure
	// time themselves report their clock in Resource.Now, which wins.
	Now    func() time.Time
	Limits Limits // zero value: DefaultLimits
	// GrantWait bounds how long a grant waits for in-flight writes of the
	// previous token, or for a drain period, before ErrFenceBusy.
	GrantWait time.Duration
	// DrainPeriod keeps a resource closed to grants after a forward whose
	// outcome is unknown, because that write may still land upstream.
	DrainPeriod time.Duration
	// OnRejection is called after a refused write was recorded (live feed,
	// metrics). It must not block.
	OnRejection func(Rejection)
	// OnLockWait, if set, is called when an admission starts waiting for
	// its resource's shared lock (or the Fencer's hold), with the write's
	// context; the function it returns is called when the wait ends. It
	// lets tracing show the lock wait as its own span without this package
	// knowing of tracing; nil costs nothing.
	OnLockWait func(ctx context.Context) (end func())
	Logger     *slog.Logger
}

// Service applies the fence rules on top of a Store and a Locker or a
// Fencer.
//
// The safety argument, in one place:
//
//  1. A token is durable before it is returned (Store.Grant), and grants of
//     a resource are serialised by its exclusive lock (Excluder: the
//     Locker's, or with a Fencer the Fencer's), so tokens strictly
//     increase and no crash can make a store hand one out twice.
//  2. A write holds the resource's shared lock (Locker.Shared; with a
//     Fencer, its shared fence: Fencer.Hold) from the moment its lease is
//     checked until the upstream has answered (Permit.Done). A grant takes
//     the exclusive lock before it changes the token. So when a grant
//     returns, every write admitted under an older token has finished, and
//     every later write is checked against the new token: it either carries
//     the new lease or is refused. No stale write is in flight, and none can
//     start ("fence on grant").
//  3. A forward whose outcome is unknown (timeout, broken connection) may
//     still land later even though the gateway stopped waiting. Before its
//     shared lock is released the resource is put in a drain period, and
//     grants wait it out: the next holder cannot write until the old write
//     can no longer arrive. The lock is never given up earlier than a
//     recorded drain would have allowed: if the store cannot record the
//     drain (down, or its row held by another session), the write keeps
//     its lock (with a Fencer: its shared fence and presence row) and the
//     drain is asked of the store again until it is recorded, for what is
//     left of the period, or the period has passed (drain.go). The client's
//     answer does not wait for any of it. A replica that dies meanwhile is
//     covered as any replica that dies with a write in flight: its presence
//     rows in the PostgreSQL modes (point 6), the crash drain in the
//     embedded one. The other records a forward leaves (the idempotency
//     key's outcome, write counts) guard no grant, and the client's answer
//     does not wait for them either (late.go): a key whose outcome is not
//     recorded yet stays in progress (and past its deadline unknown), never
//     forwarded again, and a lost count is a dashboard's figure.
//  4. A write is admitted only on the state read under the shared lock and
//     the store's (or gateway's) clock; the worker's clock and any token the
//     client sends play no part. A write may be *refused* on a state read
//     without the lock (the PostgreSQL fence reads the lease and its fence
//     state together, and refuses on that read), because every refusal is
//     final: tokens never go down, a superseded lease never
//     becomes current again, released stays released, expired cannot be
//     renewed. For the same reason a stale_token verdict is cached for a
//     second (staleCache): only the current token it reports may age.
//  5. Any store error is ErrStoreUnavailable: nothing is forwarded unchecked.
//  6. With a Fencer (the PostgreSQL modes), a replica keeps a resource's
//     shared fence across many writes and admits them on what it read under
//     it (storage/postgres/fence.go has the argument in full). Points 2 and 4
//     still hold because whatever changes the fence state (a grant, a
//     release, a revoke) first takes the Fencer's exclusive lock, which
//     makes every replica give its shared fence up and forget what it
//     read; only expiry moves without the lock, and it is judged on a
//     clock that runs ahead of the store's. A replica's death is an
//     unknown outcome for every write it may have had in flight
//     (guarantee 7): it leaves a presence row for each fence it held, and
//     the next exclusive taker of such a resource starts a drain period
//     of the drain period plus the session check.
//     No byte of an admitted write is sent unless its fence is proven held
//     at that moment (Permit.Check, before every write system call to the
//     upstream): a replica that lost its session stops sending within the
//     session check of the loss, however long the write's body takes, so
//     every byte it sent left at least a drain period before that drain
//     ends (fence.go point 4 has the argument). --drain-period should be
//     at least --forward-timeout, as it is by default, so that this margin
//     is as long as the one a timed-out forward gets. The limit: a process
//     stopped between its last proof and its write system call (a window
//     of nanoseconds) sends what it proved a moment before it stopped.
type Service struct {
	store       Store
	locker      Locker // without a Fencer
	fencer      Fencer
	exclusive   Excluder // the Locker's or the Fencer's
	now         func() time.Time
	limits      Limits
	grantWait   time.Duration
	drainPeriod time.Duration
	onReject    func(Rejection)
	onLockWait  func(context.Context) func()
	log         *slog.Logger
	stale       *staleCache
	waiters     *waiters
	flood       floodGate // flood.go
	drains      drains    // drain.go
	late        late      // rejections recorded in the background (late.go)
}

// New returns a Service. Store is required, and exactly one of Locker and
// Fencer: New panics otherwise, a wiring mistake no configuration can make.
func New(cfg Config) *Service {
	if cfg.Store == nil || (cfg.Locker == nil) == (cfg.Fencer == nil) {
		panic("tokens.New: Config needs a Store and exactly one of Locker and Fencer")
	}
	s := &Service{
		store:       cfg.Store,
		locker:      cfg.Locker,
		fencer:      cfg.Fencer,
		exclusive:   cfg.Locker,
		now:         cfg.Now,
		limits:      cfg.Limits,
		grantWait:   cfg.GrantWait,
		drainPeriod: cfg.DrainPeriod,
		onReject:    cfg.OnRejection,
		onLockWait:  cfg.OnLockWait,
		log:         cfg.Logger,
		stale:       newStaleCache(),
		waiters:     newWaiters(),
	}
	if cfg.Fencer != nil {
		s.exclusive = cfg.Fencer
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.limits == (Limits{}) {
		s.limits = DefaultLimits
	}
	if s.grantWait <= 0 {
		s.grantWait = DefaultGrantWait
	}
	if s.drainPeriod <= 0 {
		s.drainPeriod = DefaultDrainPeriod
	}
	if s.onReject == nil {
		s.onReject = func(Rejection) {}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

// Limits returns the input limits in force.
func (s *Service) Limits() Limits { return s.limits }

// Now returns the gateway's clock.
func (s *Service) Now() time.Time { return s.now() }

// Clock is the time at which the fence rules judge r: the store's clock
// when r carries it (Resource.Now), else the gateway's. The gateway uses it
// to report a lease's state and remaining time as Admit would judge them.
func (s *Service) Clock(r Resource) time.Time {
	if !r.Now.IsZero() {
		return r.Now
	}
	return s.now()
}

// Lease returns a lease by id.
func (s *Service) Lease(ctx context.Context, leaseID string) (Lease, error) {
	return s.store.Lease(ctx, leaseID)
}

// Resource returns a resource's fence state.
func (s *Service) Resource(ctx context.Context, name string) (Resource, error) {
	if err := s.limits.ValidateResource(name); err != nil {
		return Resource{}, err
	}
	return s.store.Resource(ctx, name)
}

// Rejections lists the rejection log, newest first.
func (s *Service) Rejections(ctx context.Context, q RejectionQuery) ([]Rejection, error) {
	return s.store.Rejections(ctx, q)
}

// History lists a resource's lease history, newest first.
func (s *Service) History(ctx context.Context, resource string, limit int) ([]Event, error) {
	if err := s.limits.ValidateResource(resource); err != nil {
		return nil, err
	}
	return s.store.History(ctx, resource, limit)
}

// CurrentLeases lists live leases.
func (s *Service) CurrentLeases(ctx context.Context, limit int) ([]Lease, error) {
	return s.store.CurrentLeases(ctx, limit)
}

// Ping reports whether the store is reachable.
func (s *Service) Ping(ctx context.Context) error { return s.store.Ping(ctx) }
