package tokens

// The interfaces tokens needs from a storage mode, defined here on the
// consumer's side: Store (tokens, leases, history, the rejection log),
// Excluder, Locker and Fencer (the per-resource lock, in one process or
// across replicas), Held (a write's proof of its fence) and the
// Idempotency-Key records' store. storage/storagetest checks every backend
// against them.

import (
	"context"
	"time"
)

// GrantRequest asks a Store to grant a resource.
type GrantRequest struct {
	LeaseID  string // chosen by the Service (NewLeaseID)
	Resource string
	Holder   string
	Owner    string // the authenticated principal; "" without authentication
	// MaxLeases caps Owner's live leases, this one included (0: no cap).
	// The store counts them in the step that writes the lease, atomically
	// with it across every replica, and refuses with ErrTooManyLeases
	// (TooManyLeases) once the grant would exceed the cap.
	MaxLeases int
	// TTL was validated by the Service (Limits.ValidateTTL): at least a
	// millisecond, the stores' precision.
	TTL time.Duration
}

// Store keeps tokens, leases, lease history and the rejection log. Every
// method that changes state is atomic in the store (a transaction, a
// conditional statement or a script): the check and the change are one
// step, never a read, a decision in Go and a write across processes.
//
// Errors wrap one of this package's sentinels; a store that cannot be
// reached returns ErrStoreUnavailable (see Unavailable), never a driver error.
type Store interface {
	// Grant makes a new lease current for req.Resource with the next token.
	// If the resource has a live lease it returns ErrLeaseHeld (with the
	// holder's facts: LeaseHeld); if it is draining it returns ErrFenceBusy
	// with RetryAfter; if the grant would give req.Owner more than
	// req.MaxLeases live leases, ErrTooManyLeases (TooManyLeases). Those
	// are decided in the one atomic step that writes the lease, and this
	// is where the holder's liveness and the owner's cap are decided for a
	// grant. (The Service reads the resource before, by the same rule,
	// Resource.Holder, only to refuse a held resource without taking its
	// exclusive lock, which would stall the holder's writes; it grants
	// nothing on that read.) The new token is durable before Grant returns: a token
	// handed out and then lost in a crash could be handed out twice.
	// Expiry is computed with the store's clock.
	Grant(ctx context.Context, req GrantRequest) (Lease, error)

	// Renew extends the current live lease to now+ttl. ErrNotFound for an
	// unknown id; ErrLeaseLost if it expired, was released or superseded.
	// The refusal is recorded in the lease history.
	Renew(ctx context.Context, leaseID string, ttl time.Duration) (Lease, error)

	// Release ends the current live lease. Releasing a lease its holder
	// already released succeeds again (idempotent). ErrLeaseLost if it
	// expired or was superseded (it never frees anyone else's lease);
	// ErrNotFound for an unknown id.
	Release(ctx context.Context, leaseID string) (Lease, error)

	// Revoke ends a lease on an administrator's order: Release's rules
	// without regard to who holds it (the current live lease is released at
	// once; one already released is revoked again without change; an
	// expired or superseded one is ErrLeaseLost; unknown, ErrNotFound). A
	// change is recorded in the lease history as EventRevoked with Actor
	// set to by.
	Revoke(ctx context.Context, leaseID, by string) (Lease, error)

	// Lease returns a lease by id, or ErrNotFound.
	Lease(ctx context.Context, leaseID string) (Lease, error)

	// Resource returns the resource's fence state with the store's clock in
	// Resource.Now, or ErrNotFound if it was never granted.
	Resource(ctx context.Context, name string) (Resource, error)

	// CurrentLeases returns up to limit live leases, soonest expiry first.
	CurrentLeases(ctx context.Context, limit int) ([]Lease, error)

	// Drain keeps the resource closed to grants until now+d (store clock),
	// or longer if it already was. Called, before the shared lock is
	// released, for a forward whose outcome is unknown.
	Drain(ctx context.Context, resource string, d time.Duration) error

	// RecordRejection appends to the rejection log and returns the entry
	// with its ID and time set. A refusal with the same RepeatKey as an
	// entry still in the log is counted on the latest such entry instead
	// (Repeats+1, At the new time, FirstAt kept, the other fields the new
	// refusal's; the ID is kept), checked and advanced atomically in the
	// store, so that concurrent gateways count one entry.
	RecordRejection(ctx context.Context, r Rejection) (Rejection, error)

	// Rejections lists the log newest first.
	Rejections(ctx context.Context, q RejectionQuery) ([]Rejection, error)

	// History lists a resource's lease events, newest first.
	History(ctx context.Context, resource string, limit int) ([]Event, error)

	// Ping reports whether the store is reachable.
	Ping(ctx context.Context) error
}

// Excluder is the exclusive side of a resource's lock: a grant takes it
// before changing the token (and, with a Fencer, a release or revoke before
// changing the lease), and holds it alone, across every replica that shares
// the lock, while writes admitted under it (Locker.Shared, Fencer.Hold) wait.
// New writes must not overtake a waiting exclusive request, or a steady
// stream of writes would starve grants. A wait ends with its context, with
// an error that wraps ctx.Err(). The returned unlock may be called more than
// once; later calls do nothing.
type Excluder interface {
	Exclusive(ctx context.Context, resource string) (unlock func(), err error)
}

// Locker is the per-resource shared/exclusive lock of the embedded mode,
// which locks per write: a write holds the shared side across its forward,
// a grant takes the exclusive side (Excluder). Shared holders coexist; an
// exclusive holder is alone. A waiting exclusive request is not overtaken
// by later shared ones (writer preference), and a shared wait, like an
// exclusive one, ends with its context and leaves no one queued behind it
// for longer than the holders it waited for. storage/storagetest.RunLocker
// checks all of this.
type Locker interface {
	Excluder
	Shared(ctx context.Context, resource string) (unlock func(), err error)
}

// Fencer admits writes under shared fences that a process keeps across many
// writes instead of locking per write (the PostgreSQL modes: see
// storage/postgres/fence.go). With a Fencer, Service.Admit asks it instead
// of the Store, and grants, releases and revokes take its exclusive side
// (Excluder) first, so that every replica gives its fence up and forgets
// the lease before they return. Hold's fences and Exclusive keep a
// Locker's rules between its two sides, except that writes queued behind
// an exclusive request that gives up still wait for the writes it waited
// for: storage/storagetest.RunFenceLock checks them.
type Fencer interface {
	Excluder
	// Hold judges a write under leaseID by the fence rule (Judge) and
	// returns its verdict. This is where a fenced write is judged: each
	// state Hold reads (or remembers) is judged here once, and the Service
	// uses the verdict as it is. If Judge admits the write, the resource's
	// shared fence is held until Verdict.Held.Release and no grant,
	// release or revoke of the resource can take effect before, as long as
	// Held.Check says so. The state may come from memory only if Judge
	// admits the write on it: a refusal is judged on a state read from the
	// store, so that no write is refused on what a replica remembers.
	// ErrNotFound for an unknown id.
	Hold(ctx context.Context, leaseID string) (Verdict, error)
}

// Verdict is a Fencer's judgement of one write.
type Verdict struct {
	// Lease is the write's lease: if admitted, State's copy of it, which
	// carries its latest renewal.
	Lease Lease
	// State is the resource's fence state the write was judged on, with
	// the store's clock (or an estimate that runs ahead of it) in Now.
	State Resource
	// Refusal is Judge's refusal (ErrStaleToken, ErrLeaseReleased,
	// ErrLeaseExpired); nil if the write is admitted.
	Refusal error
	// Held is the admitted write's hold on the fence; nil if refused (a
	// refused write holds nothing).
	Held Held
}

// Held is one admitted write's hold on its resource's shared fence.
type Held interface {
	// Release ends the hold; later calls do nothing.
	Release()
	// Check returns nil only if the fence is provably held at this moment:
	// the lock session that holds it is the one that took it, it was
	// confirmed alive (by a check sent) less than the session check ago,
	// and the fence was not dropped since. Otherwise it returns an error
	// wrapping ErrFenceLost. It is called before every write system call
	// of the write, on the goroutine that writes it, so when the proof is
	// at hand it is cheap: no I/O, no allocation, no lock shared with
	// other resources' writes. It may wait, and only then: when the
	// session is neither confirmed lately nor known lost (its health check
	// is slow to answer), it waits for that check to settle, without I/O
	// of its own, and returns nil if the check confirmed the session, or
	// ErrFenceLost if it failed, or once deadline has passed (a zero or
	// past deadline: no wait). The gateway passes the forward's deadline,
	// so a proof never holds a write past its forward timeout.
	Check(deadline time.Time) error
	// Lost returns a channel that is closed once the fence is definitely
	// lost: dropped, or its lock session destroyed (from then on Check
	// fails at once, and for good). A session that is only not confirmed
	// lately (Check's wait) does not close it. It lets a write that has
	// nothing to send, a streamed body whose client went quiet, watch its
	// fence without polling (the engine resets its half-sent request on
	// it). Nil if the fence cannot be lost.
	Lost() <-chan struct{}
}

// EventKind names what happened to a lease.
type EventKind string

// Lease history event kinds.
const (
	EventGranted        EventKind = "granted"
	EventRenewed        EventKind = "renewed"
	EventReleased       EventKind = "released"
	EventRenewRefused   EventKind = "renew_refused"
	EventReleaseRefused EventKind = "release_refused"
	// EventRevoked: an administrator ended the lease (Event.Actor names them).
	EventRevoked EventKind = "revoked"
)

// Event is one entry of a resource's lease history.
type Event struct {
	At        time.Time
	Resource  string
	Kind      EventKind
	Token     int64
	Holder    string
	ExpiresAt time.Time
	// Actor is who caused the event when it was not the holder: the
	// administrator of an EventRevoked. Empty otherwise.
	Actor string
	// Key: the facts of an idempotency event (EventReplayed,
	// EventRetryRefused: see tokens/idempotency.go); nil otherwise.
	Key *KeyEvent
}
