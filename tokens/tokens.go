// Package tokens is fencegw's domain: leases, fencing tokens, the rules that
// decide whether a write may reach an upstream, and the store interfaces
// those rules need. It imports only the standard library and
// internal/failpoint's constants (the torture's broken builds); storage
// backends implement its interfaces and the HTTP layer translates its errors.
package tokens

import (
	"crypto/rand"
	"encoding/base32"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Lease is one grant of a resource to a holder. The ID is a secret known only
// to the worker that acquired it: presenting it is what proves that a write
// comes from that grant.
type Lease struct {
	ID       string
	Resource string
	Holder   string
	// Owner is the authenticated principal that acquired the lease ("" when
	// the gateway runs without authentication). It never changes: only that
	// principal may write, renew or release with the lease.
	Owner      string
	Token      int64
	TTL        time.Duration // as granted or last renewed; a renew without ttl reuses it
	GrantedAt  time.Time
	ExpiresAt  time.Time
	ReleasedAt time.Time // zero while not released
}

// Released reports whether the holder released the lease.
func (l Lease) Released() bool { return !l.ReleasedAt.IsZero() }

// Live reports whether the lease is unreleased and unexpired at now.
func (l Lease) Live(now time.Time) bool {
	return !l.Released() && now.Before(l.ExpiresAt)
}

// Remaining is the lease's remaining time at now, never negative.
func (l Lease) Remaining(now time.Time) time.Duration {
	if d := l.ExpiresAt.Sub(now); d > 0 && !l.Released() {
		return d
	}
	return 0
}

// Resource is the fence state of one resource: the last token granted and
// the lease that holds (or last held) it.
type Resource struct {
	Name string
	// Token is the last granted token; 0 if never granted. Never decreases.
	Token int64
	// Lease is the lease that got Token, if any (it may be expired or released).
	Lease *Lease
	// DrainUntil: grants wait until then, because a forward whose outcome is
	// unknown may still land at the upstream.
	DrainUntil time.Time
	// Now is the store's clock when this state was read (zero: use the
	// gateway's). Lease time is measured by the gateway or the store, never by
	// the worker.
	Now time.Time
}

// Holder is the current live lease, or nil.
func (r Resource) Holder(now time.Time) *Lease {
	if r.Lease != nil && r.Lease.Token == r.Token && r.Lease.Live(now) {
		return r.Lease
	}
	return nil
}

// Rejection records one refused write, or the repeats of one (see
// RepeatKey). It never holds a whole lease id or a body.
type Rejection struct {
	ID int64
	// At is when the last of the repeats was refused.
	At           time.Time
	Resource     string
	Code         string // the problem code, e.g. "stale_token"
	Token        int64
	CurrentToken int64
	Holder       string
	LeaseHint    string // a short, non-secret part of the lease id (LeaseHint)
	Method       string
	Upstream     string
	Path         string
	// Principal is the authenticated caller that presented the lease (""
	// without authentication): for lease_not_owned the thief, while Holder
	// is the lease's own.
	Principal string
	// LeaseEndedAt is when the presented lease expired or was released (zero
	// if it was still live or unknown), so "arrived 15 s after its lease
	// ended" can be shown.
	LeaseEndedAt time.Time
	// WouldRefuse: the upstream only observes (Write.Observe), and the
	// write was forwarded; Code is what an enforcing upstream would have
	// refused it with.
	WouldRefuse bool
	// TraceID is the write's OpenTelemetry trace id (32 hex digits; "":
	// not traced), so that an incident links to its trace.
	TraceID string
	// Repeats counts the refusals this entry stands for (1 for a single
	// one): the store counts a refusal with the same RepeatKey as its
	// latest entry on that entry instead of appending, so that a flood under
	// one lease cannot push other incidents out of the bounded log. The
	// other fields are those of the last refusal. 0 from a caller means 1.
	Repeats int64
	// FirstAt is when the first of the repeats was refused (At for one).
	FirstAt time.Time
}

// RepeatKey is what makes two refusals repeats of one another: the same
// resource, lease (by its hint, as the log keeps it), token, code,
// principal and WouldRefuse. A refusal without a known lease (token 0: unknown_lease) has
// no key and is always appended, at the rate tokens/flood.go allows.
func (r Rejection) RepeatKey() (string, bool) {
	if r.Token <= 0 {
		return "", false
	}
	return strings.Join([]string{r.Resource, r.LeaseHint, strconv.FormatInt(r.Token, 10), r.Code, strconv.FormatBool(r.WouldRefuse), r.Principal}, "\x1f"), true
}

// RejectionCodes lists every code a rejection can have, for filters.
var RejectionCodes = []string{CodeStaleToken, CodeLeaseExpired, CodeLeaseReleased, CodeUnknownLease, CodeLeaseNotOwned, CodeResourceMismatch, CodeForbidden}

// RejectionQuery selects rejections, newest first.
type RejectionQuery struct {
	Resource string    // exact match; empty for all
	Since    time.Time // only rejections at or after; zero for all
	Before   int64     // cursor: only IDs below it; 0 for the newest
	Limit    int
}

// Limits bounds client input. DefaultLimits are docs/design.md's defaults.
type Limits struct {
	MaxResource int
	MaxHolder   int
	MinTTL      time.Duration
	MaxTTL      time.Duration
	MaxWait     time.Duration
}

// DefaultLimits are the documented defaults.
var DefaultLimits = Limits{
	MaxResource: 256,
	MaxHolder:   128,
	MinTTL:      100 * time.Millisecond,
	MaxTTL:      time.Hour,
	MaxWait:     60 * time.Second,
}

// ValidateResource checks a resource name: 1..max bytes of A-Z a-z 0-9 . _ : @ / -
func (l Limits) ValidateResource(name string) error {
	if name == "" {
		return Invalid("resource", "must not be empty")
	}
	if len(name) > l.MaxResource {
		return Invalid("resource", "longer than "+strconv.Itoa(l.MaxResource)+" bytes")
	}
	for i := 0; i < len(name); i++ {
		if !ResourceByte(name[i]) {
			return Invalid("resource", "may contain only A-Z a-z 0-9 . _ : @ / -")
		}
	}
	return nil
}

// ResourceByte reports whether c may appear in a resource name: the one
// definition of the name's bytes, for ValidateResource and for the
// gateway's route templates, which are checked before any name is made.
func ResourceByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("._:@/-", c) >= 0
}

// ValidateHolder checks a holder label: at most max bytes of printable UTF-8.
// Holders are shown on the dashboard and in logs, so characters that change
// how the text around them reads are refused too: controls (C0, DEL, C1),
// format characters (Unicode Cf: bidi embeddings, overrides and isolates,
// zero-width spaces and joiners, soft hyphens, the BOM) and line or
// paragraph separators. A holder "worker-1\u202Eexe.dat" would otherwise
// show as another name.
func (l Limits) ValidateHolder(holder string) error {
	if len(holder) > l.MaxHolder {
		return Invalid("holder", "longer than "+strconv.Itoa(l.MaxHolder)+" bytes")
	}
	for _, r := range holder {
		if r == '\uFFFD' || r < 0x20 || r == 0x7f {
			return Invalid("holder", "must be printable UTF-8")
		}
		if r >= 0x80 && (unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp)) {
			return Invalid("holder", "must not contain invisible or direction-changing characters (like U+"+
				strings.ToUpper(strconv.FormatInt(int64(r), 16))+")")
		}
	}
	return nil
}

// ValidateTTL checks a lease duration, of an acquire or a renewal: within
// the limits, and at most keyMax, the caller's own cap (0: none; auth's
// max_ttl_ms), which key names. It is the one check of a TTL: the stores
// take the TTL the Service validated here.
func (l Limits) ValidateTTL(ttl, keyMax time.Duration, key string) error {
	if ttl < l.MinTTL || ttl > l.MaxTTL {
		return Invalid("ttl_ms", "must be between "+strconv.Itoa(int(l.MinTTL.Milliseconds()))+" and "+strconv.Itoa(int(l.MaxTTL.Milliseconds())))
	}
	if keyMax > 0 && ttl > keyMax {
		return Invalid("ttl_ms", "must be at most "+strconv.FormatInt(keyMax.Milliseconds(), 10)+" for key "+strconv.Quote(key))
	}
	return nil
}

// ValidateWait checks how long an acquire may wait.
func (l Limits) ValidateWait(wait time.Duration) error {
	if wait < 0 || wait > l.MaxWait {
		return Invalid("wait_ms", "must be between 0 and "+strconv.Itoa(int(l.MaxWait.Milliseconds())))
	}
	return nil
}

// LeaseIDPrefix starts every lease id, so a leaked one is recognisable.
const LeaseIDPrefix = "fl_"

// A lease id is LeaseIDPrefix, leaseTimeChars of the grant's Unix
// milliseconds, then leaseRandomChars of 160 random bits, both in lowercase
// base32hex. That alphabet is in ASCII order, so ids sort by the time they
// were made: a store keyed by lease id (storage/bolt's B-tree) appends new
// ids near its right edge instead of inserting each into a random page,
// which kept every page of the index resident and made each commit dirty
// pages all over the file. The secret is the random part alone; the time
// part tells a holder of the id nothing it did not know (granted_at).
//
// Ids made before this format ("fl_" + 32 chars of lowercase standard
// base32, all random) are still valid: an id is opaque to every store, only
// LeaseHint looks inside it.
const (
	leaseTimeChars   = 10 // 50 bits of milliseconds: enough until the year 37,000
	leaseRandomChars = 32 // 160 bits
	leaseIDLen       = len(LeaseIDPrefix) + leaseTimeChars + leaseRandomChars
	leaseHintChars   = 6
)

const base32hex = "0123456789abcdefghijklmnopqrstuv"

var leaseIDEncoding = base32.NewEncoding(base32hex).WithPadding(base32.NoPadding)

// NewLeaseID returns an unguessable lease id with 160 random bits, ordered
// by the time it was made.
func NewLeaseID() string { return newLeaseID(time.Now()) }

func newLeaseID(now time.Time) string {
	var b [20]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go >= 1.24)
	id := make([]byte, leaseIDLen)
	copy(id, LeaseIDPrefix)
	ms := uint64(max(now.UnixMilli(), 0))
	for i := len(LeaseIDPrefix) + leaseTimeChars - 1; i >= len(LeaseIDPrefix); i-- {
		id[i] = base32hex[ms&31]
		ms >>= 5
	}
	leaseIDEncoding.Encode(id[len(LeaseIDPrefix)+leaseTimeChars:], b[:])
	return string(id)
}

// LeaseHint is the non-secret part of a lease id shown in logs and on the
// dashboard: enough to tell leases apart, far too little to forge one. For
// a time-ordered id it is the start of the random part (the time part of
// two leases granted in the same millisecond is the same).
func LeaseHint(id string) string {
	if len(id) == leaseIDLen && strings.HasPrefix(id, LeaseIDPrefix) {
		start := len(LeaseIDPrefix) + leaseTimeChars
		return LeaseIDPrefix + id[start:start+leaseHintChars] + "…"
	}
	const n = len(LeaseIDPrefix) + leaseHintChars
	if len(id) <= n {
		return "…"
	}
	return id[:n] + "…"
}

// RedactLeaseIDs returns s with every lease id in it (LeaseIDPrefix and
// the id characters after it, as in a path /v1/leases/fl_.../renew)
// replaced by its LeaseHint: what a log may hold of a lease. The id is the
// lease's secret, and logs travel further than the gateway.
func RedactLeaseIDs(s string) string {
	i := strings.Index(s, LeaseIDPrefix)
	if i < 0 {
		return s
	}
	var b strings.Builder
	for i >= 0 {
		b.WriteString(s[:i])
		end := i + len(LeaseIDPrefix)
		for end < len(s) && leaseIDByte(s[end]) {
			end++
		}
		b.WriteString(LeaseHint(s[i:end]))
		s = s[end:]
		i = strings.Index(s, LeaseIDPrefix)
	}
	b.WriteString(s)
	return b.String()
}

// leaseIDByte: a byte a lease id (of either format) or a client's guess
// at one may hold, so none of it is left in the clear.
func leaseIDByte(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-' || c == '_' || c == '%'
}

// LeaseState is where a lease stands relative to its resource.
type LeaseState string

// Lease states.
const (
	StateCurrent    LeaseState = "current"
	StateExpired    LeaseState = "expired"
	StateReleased   LeaseState = "released"
	StateSuperseded LeaseState = "superseded"
)

// StateOf tells where lease stands in r at now. This is the fence rule, in
// its one place: a newer grant wins over release, and release over expiry.
// Judge refuses writes by it.
func (r Resource) StateOf(lease Lease, now time.Time) LeaseState {
	current := r.Lease
	switch {
	case r.Token > lease.Token || current == nil || current.ID != lease.ID:
		return StateSuperseded
	case current.Released():
		return StateReleased
	case !now.Before(current.ExpiresAt):
		return StateExpired
	}
	return StateCurrent
}

// Judge applies the fence rule (Resource.StateOf, which holds its
// precedence) to a write under lease, given the resource's state read under
// its shared lock, at now. It returns nil if the write may pass, or an
// *Error explaining the refusal: ErrStaleToken for a superseded lease (even
// if it also expired), else ErrLeaseReleased, else ErrLeaseExpired.
func Judge(lease Lease, r Resource, now time.Time) error {
	var kind error
	switch r.StateOf(lease, now) {
	case StateCurrent:
		return nil
	case StateReleased:
		kind = ErrLeaseReleased
	case StateExpired:
		kind = ErrLeaseExpired
	default:
		kind = ErrStaleToken
	}
	e := &Error{Kind: kind, Resource: lease.Resource, Token: lease.Token, CurrentToken: r.Token, Holder: lease.Holder, ExpiresAt: lease.ExpiresAt}
	if current := r.Lease; current != nil && current.ID == lease.ID {
		e.ExpiresAt = current.ExpiresAt // a renewal since lease was read
	}
	return e
}
