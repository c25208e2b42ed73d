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

const codecVersion = 4

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

func (d *decoder) int() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("varint", "truncated or overflowing")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("uvarint", "truncated or overflowing")
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
	if n > uint64(len(d.b)) {
		d.fail("string", "length beyond the record")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) time() time.Time {
	n := d.int()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// finish reports the first decoding error; trailing bytes are corruption
// too, since this version writes none.
func (d *decoder) finish(what string) error {
	if d.err == nil && len(d.b) != 0 {
		d.fail(what, "trailing bytes")
	}
	return d.err
}

// leaseRecord is a lease without its id, which is the key.
func encodeLease(l *tokens.Lease) []byte {
	e := newEncoder()
	e.str(l.Resource)
	e.str(l.Holder)
	e.int(l.Token)
	e.int(int64(l.TTL))
	e.time(l.GrantedAt)
	e.time(l.ExpiresAt)
	e.time(l.ReleasedAt)
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
	l.ExpiresAt = d.time()
	l.ReleasedAt = d.time()
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
	e.str(r.current)
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
	r.current = d.str()
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
	return r, d.finish("rejection")
}

func encodeEvent(ev *tokens.Event) []byte {
	e := newEncoder()
	e.time(ev.At)
	e.str(string(ev.Kind))
	e.int(ev.Token)
	e.str(ev.Holder)
	e.time(ev.ExpiresAt)
	e.str(ev.Actor)
	encodeKeyEvent(e, ev.Key)
	return e.b
}

func decodeEvent(resource string, b []byte) (tokens.Event, error) {
	d := newDecoder("event", b)
	ev := tokens.Event{Resource: resource}
	ev.At = d.time()
	ev.Kind = tokens.EventKind(d.str())
	ev.Token = d.int()
	ev.Holder = d.str()
	ev.ExpiresAt = d.time()
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
