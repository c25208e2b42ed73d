package bolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/fencegw/fencegw/internal/failpoint"
	"github.com/fencegw/fencegw/tokens"
)

// Values are a version byte followed by varint-encoded fields. Times are
// Unix nanoseconds (0 for the zero time), durations nanoseconds, strings
// length-prefixed. Decoding checks every length against the remaining bytes,
// so a corrupt value is an error, never a panic or a huge allocation.
//
// Version 2 appends a lease's Owner and an event's Actor; version 1 records
// (written before authentication existed) still decode, with both empty.
// Version 3 appends a rejection's Principal (older ones decode with none).
// Version 4 appends an event's idempotency facts (see encodeKeyEvent).
// Version 5 makes the records of every grant smaller (docs/benchmarks.md,
// "Memory"): a resource's current lease id is packed (leaseIDRef), a
// lease's expiry and release are offsets from its grant (relTime), an
// event's kind is a number (eventKinds) and its expiry an offset from its
// time.
// Version 6 appends a rejection's WouldRefuse and TraceID (older ones
// decode with neither).
// Version 7 appends a rejection's Repeats and FirstAt (older ones decode
// as a single refusal).

const codecVersion = 7

// errCorrupt is the cause of every decoding failure.
var errCorrupt = errors.New("corrupt record")

type encoder struct{ b []byte }

func newEncoder() *encoder { return &encoder{b: append(make([]byte, 0, 96), codecVersion)} }

func (e *encoder) int(v int64)      { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) uint(v uint64)    { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) str(v string)     { e.uint(uint64(len(v))); e.b = append(e.b, v...) }
func (e *encoder) time(v time.Time) { e.int(unixNano(v)) }

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

type decoder struct {
	b       []byte
	version byte
	err     error
}

func newDecoder(what string, b []byte) *decoder {
	d := &decoder{b: b}
	if len(b) == 0 || b[0] < 1 || b[0] > codecVersion {
		d.fail(what, "unknown version")
		return d
	}
	d.version, d.b = b[0], b[1:]
	return d
}

func (d *decoder) fail(what, why string) {
	if d.err == nil {
		d.err = fmt.Errorf("%s: %s: %w", what, why, errCorrupt)
	}
}

func (d *decoder) int() int64 { return varint(d, "varint", binary.Varint) }

func (d *decoder) uint() uint64 { return varint(d, "uvarint", binary.Uvarint) }

// varint reads one varint with read (binary.Varint or binary.Uvarint).
func varint[T int64 | uint64](d *decoder, what string, read func([]byte) (T, int)) T {
	if d.err != nil {
		return 0
	}
	v, n := read(d.b)
	if n <= 0 {
		d.fail(what, "truncated or overflowing")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) str() string {
	n := d.uint()
	if d.err != nil {
		return ""
	}
	return d.take(n, "string")
}

// take is the next n bytes, as a string.
func (d *decoder) take(n uint64, what string) string {
	if n > uint64(len(d.b)) {
		d.fail(what, "length beyond the record")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) time() time.Time {
	return fromUnixNano(d.int())
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// relTime encodes v as its offset from base (both Unix nanoseconds, 0 for
// the zero time), a few bytes instead of nine when they are close: 0 for
// the zero time, offsets at or after base shifted up by one.
func (e *encoder) relTime(v time.Time, base int64) {
	if v.IsZero() {
		e.int(0)
		return
	}
	d := v.UnixNano() - base
	if d >= 0 {
		d++
	}
	e.int(d)
}

func (d *decoder) relTime(base int64) time.Time {
	v := d.int()
	switch {
	case v == 0:
		return time.Time{}
	case v > 0:
		v--
	}
	return fromUnixNano(base + v)
}

// leaseIDRef encodes a lease id: 0 for none, 1 and the 27 bytes of
// packLeaseID for an id in the time-ordered format, else 2 + its length and
// the id.
func (e *encoder) leaseIDRef(id string) {
	switch p, ok := packLeaseID(id); {
	case id == "":
		e.uint(0)
	case ok:
		e.uint(1)
		e.b = append(e.b, p[:]...)
	default:
		e.uint(uint64(len(id)) + 2)
		e.b = append(e.b, id...)
	}
}

func (d *decoder) leaseIDRef() string {
	switch n := d.uint(); {
	case d.err != nil || n == 0:
		return ""
	case n == 1:
		if len(d.b) < packedLeaseIDLen {
			d.fail("lease id", "truncated")
			return ""
		}
		id := unpackLeaseID(d.b[:packedLeaseIDLen])
		d.b = d.b[packedLeaseIDLen:]
		return id
	default:
		return d.take(n-2, "lease id")
	}
}

// Lease ids of the time-ordered format (tokens.NewLeaseID: "fl_" and 42
// lowercase base32hex characters, 10 of Unix milliseconds then 32 random)
// pack into 27 bytes, 5 bits a character, in the same byte order.
const (
	leaseIDPrefix    = tokens.LeaseIDPrefix
	leaseIDChars     = 42
	packedLeaseIDLen = (leaseIDChars*5 + 7) / 8
	base32hexDigits  = "0123456789abcdefghijklmnopqrstuv"
)

// packLeaseID packs a time-ordered id, eight characters (40 bits, five
// bytes) at a time, the last two into the last two bytes. A grant packs
// its id twice in the committer's transaction (the record's key, once for
// the unused check and the write, and the resource state's reference),
// where every instruction is spent while the batch behind it waits: table
// lookups without a branch per character.
func packLeaseID(id string) (p [packedLeaseIDLen]byte, ok bool) {
	if len(id) != len(leaseIDPrefix)+leaseIDChars || id[:len(leaseIDPrefix)] != leaseIDPrefix {
		return p, false
	}
	s := id[len(leaseIDPrefix):]
	var bad byte // any value over 31: a character outside base32hex
	for g := range leaseIDChars / 8 {
		c := s[g*8:][:8]
		var acc uint64
		for i := range 8 {
			v := base32hexValues[c[i]]
			bad |= v
			acc = acc<<5 | uint64(v)
		}
		q := p[g*5:][:5]
		q[0], q[1], q[2], q[3], q[4] = byte(acc>>32), byte(acc>>24), byte(acc>>16), byte(acc>>8), byte(acc)
	}
	v0, v1 := base32hexValues[s[40]], base32hexValues[s[41]] // leaseIDChars is 42 (below)
	bad |= v0 | v1
	p[25] = v0<<3 | v1>>2
	p[26] = v1 << 6 // its last 2 bits, then 6 zero bits
	// A first byte of 0xff (ids of the year 35,000 on) is left to the
	// other ids' form: it tags them in leaseKey.
	return p, bad < 32 && p[0] != otherLeaseKey
}

// The groups above and the last two characters are 42 characters.
var (
	_ [leaseIDChars - 42]struct{}
	_ [42 - leaseIDChars]struct{}
)

// base32hexValues maps a base32hex digit to its value, anything else to
// 0xff.
var base32hexValues = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i := range len(base32hexDigits) {
		t[base32hexDigits[i]] = byte(i)
	}
	return t
}()

func unpackLeaseID(p []byte) string {
	id := make([]byte, len(leaseIDPrefix), len(leaseIDPrefix)+leaseIDChars)
	copy(id, leaseIDPrefix)
	var acc uint32
	bits := 0
	for _, b := range p {
		acc = acc<<8 | uint32(b)
		for bits += 8; bits >= 5 && len(id) < cap(id); {
			bits -= 5
			id = append(id, base32hexDigits[acc>>bits&31])
		}
	}
	return string(id)
}

// finish reports the first decoding error; trailing bytes are corruption
// too, since this version writes none.
func (d *decoder) finish(what string) error {
	if d.err == nil && len(d.b) != 0 {
		d.fail(what, "trailing bytes")
	}
	return d.err
}

// encodeLease encodes a lease without its id, which is its key.
func encodeLease(l *tokens.Lease) []byte {
	e := newEncoder()
	e.str(l.Resource)
	e.str(l.Holder)
	e.int(l.Token)
	e.int(int64(l.TTL))
	e.time(l.GrantedAt)
	// Version 5: relative to the grant (and the expiry to the grant's
	// end), one byte for a lease as granted.
	granted := unixNano(l.GrantedAt)
	e.relTime(l.ExpiresAt, granted+int64(l.TTL))
	e.relTime(l.ReleasedAt, granted)
	e.str(l.Owner)
	return e.b
}

func decodeLease(id string, b []byte) (tokens.Lease, error) {
	d := newDecoder("lease", b)
	l := tokens.Lease{ID: id}
	l.Resource = d.str()
	l.Holder = d.str()
	l.Token = d.int()
	l.TTL = time.Duration(d.int())
	l.GrantedAt = d.time()
	if d.version >= 5 {
		granted := unixNano(l.GrantedAt)
		l.ExpiresAt = d.relTime(granted + int64(l.TTL))
		l.ReleasedAt = d.relTime(granted)
	} else {
		l.ExpiresAt = d.time()
		l.ReleasedAt = d.time()
	}
	if d.version >= 2 {
		l.Owner = d.str()
	}
	return l, d.finish("lease")
}

// resState is a resource's persisted fence state; the name is the key.
type resState struct {
	token      int64
	current    string // id of the lease that got token; "" if none
	drainUntil time.Time
}

func encodeResource(r *resState) []byte {
	e := newEncoder()
	e.int(r.token)
	e.leaseIDRef(r.current) // version 5
	e.time(r.drainUntil)
	return e.b
}

func decodeResource(b []byte) (resState, error) {
	d := newDecoder("resource", b)
	var r resState
	r.token = d.int()
	if failpoint.FloatTokens {
		r.token = int64(float64(r.token))
	}
	if d.version >= 5 {
		r.current = d.leaseIDRef()
	} else {
		r.current = d.str()
	}
	r.drainUntil = d.time()
	return r, d.finish("resource")
}

func encodeRejection(r *tokens.Rejection) []byte {
	e := newEncoder()
	e.time(r.At)
	e.str(r.Resource)
	e.str(r.Code)
	e.int(r.Token)
	e.int(r.CurrentToken)
	e.str(r.Holder)
	e.str(r.LeaseHint)
	e.str(r.Method)
	e.str(r.Upstream)
	e.str(r.Path)
	e.time(r.LeaseEndedAt)
	e.str(r.Principal) // version 3
	var observed uint64
	if r.WouldRefuse {
		observed = 1
	}
	e.uint(observed) // version 6
	e.str(r.TraceID)
	e.int(r.Repeats) // version 7
	e.time(r.FirstAt)
	return e.b
}

func decodeRejection(id int64, b []byte) (tokens.Rejection, error) {
	d := newDecoder("rejection", b)
	r := tokens.Rejection{ID: id}
	r.At = d.time()
	r.Resource = d.str()
	r.Code = d.str()
	r.Token = d.int()
	r.CurrentToken = d.int()
	r.Holder = d.str()
	r.LeaseHint = d.str()
	r.Method = d.str()
	r.Upstream = d.str()
	r.Path = d.str()
	r.LeaseEndedAt = d.time()
	if d.version >= 3 {
		r.Principal = d.str()
	}
	if d.version >= 6 {
		r.WouldRefuse = d.uint() == 1
		r.TraceID = d.str()
	}
	r.Repeats, r.FirstAt = 1, r.At
	if d.version >= 7 {
		r.Repeats, r.FirstAt = d.int(), d.time()
	}
	return r, d.finish("rejection")
}

// eventKinds numbers the event kinds for the codec (version 5): a kind's
// number is its index, kept forever; 0 means the kind's name follows.
var eventKinds = []tokens.EventKind{"", tokens.EventGranted, tokens.EventRenewed, tokens.EventReleased,
	tokens.EventRenewRefused, tokens.EventReleaseRefused, tokens.EventRevoked, tokens.EventReplayed,
	tokens.EventRetryRefused}

var eventKindNumbers = func() map[tokens.EventKind]uint64 {
	m := make(map[tokens.EventKind]uint64, len(eventKinds))
	for i, k := range eventKinds[1:] {
		m[k] = uint64(i + 1)
	}
	return m
}()

func encodeEvent(ev *tokens.Event) []byte {
	e := newEncoder()
	e.time(ev.At)
	if n, ok := eventKindNumbers[ev.Kind]; ok {
		e.uint(n)
	} else {
		e.uint(0)
		e.str(string(ev.Kind))
	}
	e.int(ev.Token)
	e.str(ev.Holder)
	e.relTime(ev.ExpiresAt, unixNano(ev.At))
	e.str(ev.Actor)
	encodeKeyEvent(e, ev.Key)
	return e.b
}

func decodeEvent(resource string, b []byte) (tokens.Event, error) {
	d := newDecoder("event", b)
	ev := tokens.Event{Resource: resource}
	ev.At = d.time()
	if d.version >= 5 {
		switch n := d.uint(); {
		case n == 0:
			ev.Kind = tokens.EventKind(d.str())
		case n < uint64(len(eventKinds)):
			ev.Kind = eventKinds[n]
		default:
			d.fail("event", "unknown kind")
		}
	} else {
		ev.Kind = tokens.EventKind(d.str())
	}
	ev.Token = d.int()
	ev.Holder = d.str()
	if d.version >= 5 {
		ev.ExpiresAt = d.relTime(unixNano(ev.At))
	} else {
		ev.ExpiresAt = d.time()
	}
	if d.version >= 2 {
		ev.Actor = d.str()
	}
	if d.version >= 4 {
		ev.Key = decodeKeyEvent(d)
	}
	return ev, d.finish("event")
}

// seqKey encodes a sequence number as a big-endian key, so that bolt's byte
// order is numeric order.
func seqKey(n uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), n)
}

func keySeq(k []byte) (uint64, bool) {
	if len(k) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(k), true
}
