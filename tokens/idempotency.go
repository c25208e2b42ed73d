package tokens

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/fencegw/fencegw/internal/failpoint"
)

// Idempotency keys: a fenced write may carry a key (the Idempotency-Key
// header of draft-ietf-httpapi-idempotency-key-header), and the gateway
// applies each key at most once per scope.
//
// Fencing stops a stale holder; it does not stop the current holder from
// applying the same write twice after a timeout it cannot interpret. The
// rules, in one place:
//
//  1. The fence comes first. A keyed write is admitted (Service.Admit) like
//     any other before its key is looked at, so a write under a superseded,
//     expired or released lease is refused whatever its key, and a replay
//     is answered only to a caller whose lease is current.
//  2. The key's scope is its resource, upstream and principal, never the
//     token: a retry under a newer lease of the same resource is answered
//     from the record of the first attempt.
//  3. Before the request leaves, the key is recorded durably as in progress
//     with the request's fingerprint (method, path, query, body digest). A
//     gateway that dies with the write in flight leaves that record behind,
//     and it answers "outcome unknown" from then on: a key is never
//     forwarded twice on the strength of a record that was lost.
//  4. The upstream's answer is recorded (status, the headers worth
//     replaying, the body up to a size) before it goes back to the client,
//     if the store takes it within the caller's bound: a client that saw an
//     answer then always finds it recorded. An answer is not held back
//     for a store that is slow or down, nor is a 504: what the store did
//     not take is recorded in the background (late.go), and until it lands
//     the key is in progress, so that a retry is refused (rule 5), never
//     forwarded again.
//  5. A retry of a recorded key: the same fingerprint is replayed from the
//     record without reaching the upstream; another fingerprint is
//     ErrKeyMismatch (422); a first attempt still in flight is
//     ErrKeyInProgress (409, Retry-After); a first attempt whose outcome is
//     unknown (504, a broken connection, a crash in flight) is
//     ErrOutcomeUnknown (409) — the caller decides, the gateway never
//     forwards it again.
//  6. A key whose first attempt never left the gateway (the upstream could
//     not be reached) or that the upstream refused to process (408, 425,
//     429, 503) is forgotten, so its retry is forwarded.
//  7. Records expire after the window (default 24 h) and the store bounds
//     their number (the oldest go first); a key retried after that is a
//     new key.
//  8. A retry answered from the record, and one refused because the first
//     attempt's outcome is unknown or its fingerprint differs, is an event
//     in the resource's lease history (KeyHistoryEvent) with the time of
//     the first attempt: "replayed from the write of 07:03:08". The store
//     records it with the lookup that found the record, in the same commit
//     where it can (a share of a group commit, never an fsync of its own
//     per retry).

// Defaults of IdempotencyConfig.
const (
	DefaultIdempotencyWindow  = 24 * time.Hour
	DefaultIdempotencyMaxBody = 64 << 10
	// MaxIdempotencyKey is the longest key accepted, in bytes.
	MaxIdempotencyKey = 255
	// MaxReplayHeader bounds the replayable header bytes kept per record.
	MaxReplayHeader = 8 << 10
)

// Sentinel errors of idempotent writes.
var (
	// ErrKeyMismatch: the key was used for a different request (422).
	ErrKeyMismatch = NewKind(CodeKeyMismatch, "idempotency key reused for a different request")
	// ErrKeyInProgress: the key's first attempt is still in flight (409).
	ErrKeyInProgress = NewKind(CodeKeyInProgress, "idempotency key in progress")
	// ErrOutcomeUnknown: the key's first attempt was forwarded and its
	// outcome is unknown; it is never forwarded again (409).
	ErrOutcomeUnknown = NewKind(CodeOutcomeUnknown, "idempotency key outcome unknown")
)

// Problem codes of idempotent writes.
const (
	CodeKeyMismatch    = "idempotency_key_mismatch"
	CodeKeyInProgress  = "idempotency_key_in_progress"
	CodeOutcomeUnknown = "idempotency_outcome_unknown"
)

// KeyScope names one idempotency key: the key applies at most once per
// resource, upstream and principal ("" without authentication).
type KeyScope struct {
	Resource  string
	Upstream  string
	Principal string
	Key       string
}

// KeyState is where a recorded key stands.
type KeyState string

// Key states.
const (
	// KeyInProgress: the first attempt is (or was, until Deadline) in flight.
	KeyInProgress KeyState = "in_progress"
	// KeyCompleted: the upstream answered; the answer is in the record.
	KeyCompleted KeyState = "completed"
	// KeyUnknown: the first attempt was forwarded and no answer came.
	KeyUnknown KeyState = "unknown"
)

// KeyRecord is the durable record of one key.
type KeyRecord struct {
	Scope KeyScope
	// Attempt identifies the first attempt (random): only it may finish
	// or drop the record.
	Attempt string
	// Fingerprint is the digest of the request (see Fingerprint).
	Fingerprint string
	State       KeyState
	// Token is the fencing token the first attempt was forwarded under.
	Token     int64
	StartedAt time.Time
	// Deadline: an in-progress record older than this is an unknown
	// outcome (its forward cannot be running any more).
	Deadline    time.Time
	CompletedAt time.Time // zero unless completed or unknown
	ExpiresAt   time.Time
	// The recorded answer (KeyCompleted).
	Status int
	Header map[string][]string
	Body   []byte
	// BodyOmitted: the answer's body was longer than the configured
	// maximum and is not in the record.
	BodyOmitted bool
	// Now is the store's clock when the record was read (zero: use the
	// gateway's).
	Now time.Time
}

// Size is the record's approximate stored size in bytes.
func (r KeyRecord) Size() int {
	n := len(r.Scope.Resource) + len(r.Scope.Upstream) + len(r.Scope.Principal) + len(r.Scope.Key) + len(r.Attempt) + len(r.Fingerprint) + len(r.Body) + 64
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// KeyBegin asks a store to record a key as in progress.
type KeyBegin struct {
	Scope       KeyScope
	Attempt     string
	Fingerprint string
	Token       int64
	// Holder is the holder of the lease the write came under (for the
	// history event of a retry).
	Holder string
	// InFlight is the longest the forward can take; the record's Deadline
	// is the store's now plus it.
	InFlight time.Duration
	// Window is how long the record is kept; ExpiresAt is now plus it.
	Window time.Duration
}

// KeyOutcome is how a first attempt ended.
type KeyOutcome struct {
	State       KeyState // KeyCompleted or KeyUnknown
	Status      int
	Header      map[string][]string
	Body        []byte
	BodyOmitted bool
	// Window: the record is kept until the store's now plus it.
	Window time.Duration
}

// IdempotencyStore keeps idempotency records. Every method is atomic in
// the store and durable before it returns; a store that cannot be reached
// returns ErrStoreUnavailable. Records of one scope never overlap: an expired
// record is replaced by the next BeginKey of its scope.
type IdempotencyStore interface {
	// BeginKey records b as in progress if b.Scope has no unexpired record
	// and returns it with fresh true; otherwise it returns the existing
	// record, unchanged, with fresh false, and appends the event that
	// KeyHistoryEvent(rec, b) gives, if any, to the resource's lease
	// history (Store.History) before it returns.
	BeginKey(ctx context.Context, b KeyBegin) (rec KeyRecord, fresh bool, err error)
	// FinishKey records the outcome of attempt, if the scope's record is
	// still that attempt's and in progress (otherwise it changes nothing).
	FinishKey(ctx context.Context, scope KeyScope, attempt string, o KeyOutcome) error
	// DropKey deletes the scope's record if it is attempt's and in progress:
	// the request never left, or the upstream refused to process it.
	DropKey(ctx context.Context, scope KeyScope, attempt string) error
	// LookupKey returns the scope's unexpired record, or ErrNotFound.
	LookupKey(ctx context.Context, scope KeyScope) (KeyRecord, error)
}

// Lease history event kinds of idempotent writes (rule 8).
const (
	// EventReplayed: a retry was answered from the record of the key's
	// first attempt, without reaching the upstream.
	EventReplayed EventKind = "replayed"
	// EventRetryRefused: a retry was refused because the first attempt's
	// outcome is unknown (KeyEvent.Code CodeOutcomeUnknown) or it was a
	// different request (CodeKeyMismatch). Nothing reached the upstream.
	EventRetryRefused EventKind = "retry_refused"
)

// KeyEvent is what a lease history event of an idempotent write says
// beyond Event's common fields (whose Token and Holder are the retry's
// lease).
// (The JSON names are how a store may keep it, not an API.)
type KeyEvent struct {
	Upstream  string `json:"upstream"`
	Key       string `json:"key"`
	Principal string `json:"principal,omitempty"`
	// WriteAt is when the key's first attempt was recorded and forwarded:
	// the write the retry refers to.
	WriteAt time.Time `json:"write_at"`
	// WriteToken is the token the first attempt was forwarded under (a
	// retry may come under a newer lease).
	WriteToken int64 `json:"write_token"`
	// Status is the replayed status (EventReplayed).
	Status int `json:"status,omitempty"`
	// Code is the refusal's problem code (EventRetryRefused).
	Code string `json:"code,omitempty"`
}

// KeyHistoryEvent is the lease history event of a retry b that found rec
// at now (the store's clock), if it gets one: a replay, or a refusal
// because the outcome is unknown or the fingerprint differs. A retry of a
// first attempt still in flight gets none (it is told to come back, and
// usually does within a second).
func KeyHistoryEvent(rec KeyRecord, b KeyBegin, now time.Time) (Event, bool) {
	ev := Event{At: now, Resource: b.Scope.Resource, Token: b.Token, Holder: b.Holder,
		Key: &KeyEvent{Upstream: b.Scope.Upstream, Key: b.Scope.Key, Principal: b.Scope.Principal,
			WriteAt: rec.StartedAt, WriteToken: rec.Token}}
	err := JudgeKey(rec, b.Fingerprint, now)
	switch {
	case err == nil:
		ev.Kind, ev.Key.Status = EventReplayed, rec.Status
	case errors.Is(err, ErrOutcomeUnknown):
		ev.Kind, ev.Key.Code = EventRetryRefused, CodeOutcomeUnknown
	case errors.Is(err, ErrKeyMismatch):
		ev.Kind, ev.Key.Code = EventRetryRefused, CodeKeyMismatch
	default:
		return Event{}, false
	}
	return ev, true
}

// Fingerprint is the digest that tells two requests under one key apart:
// method, path, query and the body's SHA-256.
func Fingerprint(method, path, query string, bodyDigest [sha256.Size]byte) string {
	h := sha256.New()
	for _, s := range []string{method, path, query} {
		h.Write([]byte(strconv.Itoa(len(s))))
		h.Write([]byte{':'})
		h.Write([]byte(s))
	}
	h.Write(bodyDigest[:])
	return hex.EncodeToString(h.Sum(nil))
}

// IdempotencyConfig wires an Idempotency.
type IdempotencyConfig struct {
	Store IdempotencyStore
	// Window is how long records are kept (DefaultIdempotencyWindow).
	Window time.Duration
	// MaxBody is the longest answer body kept for replay
	// (DefaultIdempotencyMaxBody); a longer one is recorded without it.
	MaxBody int
	// InFlight is the longest a forward can take (forward timeout plus
	// body timeout): an in-progress record older than that is an unknown
	// outcome. Required.
	InFlight time.Duration
	// Now is the gateway's clock; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Idempotency applies the rules of idempotent writes (see the top of this
// file) on an IdempotencyStore.
type Idempotency struct {
	store    IdempotencyStore
	window   time.Duration
	maxBody  int
	inFlight time.Duration
	now      func() time.Time
	log      *slog.Logger
	late     late // ends of keyed writes recorded in the background (late.go)
}

// NewIdempotency returns an Idempotency; Store and InFlight are required.
func NewIdempotency(cfg IdempotencyConfig) *Idempotency {
	x := &Idempotency{store: cfg.Store, window: cfg.Window, maxBody: cfg.MaxBody, inFlight: cfg.InFlight, now: cfg.Now, log: cfg.Logger}
	if x.window <= 0 {
		x.window = DefaultIdempotencyWindow
	}
	if x.maxBody <= 0 {
		x.maxBody = DefaultIdempotencyMaxBody
	}
	if x.now == nil {
		x.now = time.Now
	}
	if x.log == nil {
		x.log = slog.Default()
	}
	return x
}

// MaxBody is the longest answer body kept for replay.
func (x *Idempotency) MaxBody() int { return x.maxBody }

// Window is how long records are kept.
func (x *Idempotency) Window() time.Duration { return x.window }

// Claim is a key whose first attempt the caller now forwards. Exactly one
// of Complete, Unknown or Drop must be called once the forward ended; what
// they record is retried in the background until the store takes it
// (late.go), and until then the key stays in progress: a retry is refused,
// never forwarded.
type Claim struct {
	x       *Idempotency
	scope   KeyScope
	attempt string
	done    bool
}

// Begin applies the rules to a write with a key, admitted under lease
// (call it only after Service.Admit: the fence comes first). It returns a
// Claim if this is the key's first attempt (forward it), or the record to
// replay, or ErrKeyMismatch, ErrKeyInProgress (RetryAfter set),
// ErrOutcomeUnknown or ErrStoreUnavailable (nothing may be forwarded).
// Bound ctx: a store that cannot answer in time is ErrStoreUnavailable,
// and the record it may still make of this attempt (a statement cut short
// after its commit, the embedded store's queued commit) is dropped in the
// background, so that the key is not left in progress for a request that
// never left.
func (x *Idempotency) Begin(ctx context.Context, scope KeyScope, fingerprint string, lease Lease) (*Claim, *KeyRecord, error) {
	attempt := newAttempt()
	rec, fresh, err := x.store.BeginKey(ctx, KeyBegin{Scope: scope, Attempt: attempt, Fingerprint: fingerprint,
		Token: lease.Token, Holder: lease.Holder, InFlight: x.inFlight, Window: x.window})
	if err != nil {
		if errors.Is(err, ErrStoreUnavailable) {
			x.later("drop of an unanswered begin", scope, func(ctx context.Context) error { return x.store.DropKey(ctx, scope, attempt) })
		}
		return nil, nil, err
	}
	if fresh || failpoint.ForgetIdempotency {
		return &Claim{x: x, scope: scope, attempt: attempt}, nil, nil
	}
	if err := JudgeKey(rec, fingerprint, x.clock(rec)); err != nil {
		return nil, nil, err
	}
	return nil, &rec, nil
}

// JudgeKey applies rule 5 to an existing record at now: nil means replay
// it.
func JudgeKey(rec KeyRecord, fingerprint string, now time.Time) error {
	facts := func(kind error, detail string) *Error {
		return &Error{Kind: kind, Resource: rec.Scope.Resource, Token: rec.Token, Detail: detail}
	}
	if rec.Fingerprint != fingerprint {
		return facts(ErrKeyMismatch, "the key was first used for a request with another method, path, query or body")
	}
	switch rec.State {
	case KeyCompleted:
		return nil
	case KeyInProgress:
		if now.Before(rec.Deadline) {
			e := facts(ErrKeyInProgress, "the first request with this key is still in flight")
			e.RetryAfter = min(rec.Deadline.Sub(now), time.Second)
			return e
		}
		return facts(ErrOutcomeUnknown, "the first request with this key was in flight when its gateway stopped; whether it reached the upstream is unknown, and it is not forwarded again")
	}
	return facts(ErrOutcomeUnknown, "the first request with this key was forwarded and no answer came (timeout or broken connection); it may have been applied, and it is not forwarded again")
}

func (x *Idempotency) clock(r KeyRecord) time.Time {
	if !r.Now.IsZero() {
		return r.Now
	}
	return x.now()
}

// Complete records the upstream's answer, waiting for the store until ctx
// ends (rule 4: with a store that answers in time, the answer is recorded
// before it goes back). body is kept if it is at most MaxBody bytes, else
// the record says it was omitted. Statuses that say the upstream did not
// process the request (408, 425, 429, 503) drop the key instead, so that a
// retry is forwarded. If the store did not take the record in time, the
// error is returned and the record is retried in the background: the key
// stays in progress until it lands (a retry is told to come back), and
// turns unknown at its deadline if it never does.
func (c *Claim) Complete(ctx context.Context, status int, header map[string][]string, body []byte, omitted bool) error {
	if c.done {
		return nil
	}
	c.done = true
	if Unprocessed(status) {
		return c.x.recordOrLater(ctx, "drop", c.scope, c.drop)
	}
	if len(body) > c.x.maxBody {
		body, omitted = nil, true
	}
	if omitted {
		body = nil
	}
	o := KeyOutcome{State: KeyCompleted, Status: status, Header: header, Body: body, BodyOmitted: omitted, Window: c.x.window}
	return c.x.recordOrLater(ctx, "answer", c.scope, func(ctx context.Context) error {
		return c.x.store.FinishKey(ctx, c.scope, c.attempt, o)
	})
}

// Unknown records, in the background, that the first attempt was
// forwarded and its outcome is unknown, and returns at once: the client's
// 504 does not wait for the store. Until the record lands the key is in
// progress, and past its deadline it is unknown anyway: either way a retry
// is refused, never forwarded. The record guards no grant, so its delay
// gives nothing up early; the write's drain, which does, is kept by
// Permit.Done whatever the store does (drain.go).
func (c *Claim) Unknown() {
	if c.done {
		return
	}
	c.done = true
	c.x.later("unknown outcome", c.scope, func(ctx context.Context) error {
		return c.x.store.FinishKey(ctx, c.scope, c.attempt, KeyOutcome{State: KeyUnknown, Window: c.x.window})
	})
}

// Drop forgets the key, in the background, and returns at once: the
// request never left the gateway. Until the drop lands a retry is refused
// as in progress (and, if it never lands, as unknown past the deadline).
func (c *Claim) Drop() {
	if c.done {
		return
	}
	c.done = true
	c.x.later("drop", c.scope, c.drop)
}

func (c *Claim) drop(ctx context.Context) error { return c.x.store.DropKey(ctx, c.scope, c.attempt) }

// recordOrLater makes one attempt at record within ctx and, if it fails, goes on in
// the background (later).
func (x *Idempotency) recordOrLater(ctx context.Context, what string, scope KeyScope, record func(context.Context) error) error {
	err := record(ctx)
	if err != nil {
		x.later(what, scope, record)
	}
	return err
}

// Finished reports whether Complete, Unknown or Drop was called.
func (c *Claim) Finished() bool { return c.done }

// Unprocessed reports whether an upstream's status says it did not process
// the request and invites a retry (408, 425, 429, 503).
func Unprocessed(status int) bool {
	switch status {
	case 408, 425, 429, 503:
		return true
	}
	return false
}

// ValidKey reports whether key is an acceptable idempotency key: 1 to
// MaxIdempotencyKey bytes of printable ASCII (what an sf-string can carry).
func ValidKey(key string) error {
	if key == "" {
		return Invalid("Idempotency-Key", "must not be empty")
	}
	if len(key) > MaxIdempotencyKey {
		return Invalid("Idempotency-Key", "longer than "+strconv.Itoa(MaxIdempotencyKey)+" bytes")
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return Invalid("Idempotency-Key", "must be printable ASCII")
		}
	}
	return nil
}

func newAttempt() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
