package gateway

import (
	"bytes"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fencegw/fencegw/api"
	"github.com/fencegw/fencegw/api/server"
)

// The hot control call, POST /v1/leases, without the generated decoder and
// encoder in the common case. The generated strict handler decodes the body
// with encoding/json's Decoder (a decoder, its buffer and reflection: about
// 2 KiB and a fifth of a grant's allocations) and encodes the answer with
// an Encoder into a bytes.Buffer. fastAcquire keeps everything around that
// (the generated wrapper's header parameters, controlBody, the control
// handler, the error handlers) and replaces only these two steps, for the
// inputs and answers whose outcome it can tell exactly:
//
//   - decodeAcquire accepts one shape only: an object whose members are
//     exactly "resource", "holder", "ttl_ms" and "wait_ms", each at most
//     once, strings without escapes in valid UTF-8, integers in plain JSON
//     form that fit int64, only JSON white space around. For those
//     encoding/json yields the same request (FuzzDecodeAcquire checks it).
//     Anything else (other member names, which encoding/json would match
//     case-insensitively or ignore, escapes, null, fractions, overflow, a
//     syntax error, an empty body) goes to the generated decoder, so every
//     refusal keeps its problem code and message.
//   - appendLease writes the 201 answer byte for byte as the generated
//     json.Encoder would, when every string in it needs no escaping;
//     otherwise the generated response type writes it.

// fastAcquire is the generated strict server with AcquireLease decoded
// and answered by hand where that is exact.
type fastAcquire struct {
	server.ServerInterface // the generated strict handler
	ctl                    *control
	g                      *Gateway
}

// AcquireLease implements server.ServerInterface.
func (f *fastAcquire) AcquireLease(w http.ResponseWriter, r *http.Request, params api.AcquireLeaseParams) {
	rb, ok := r.Body.(*readBody)
	if !ok {
		f.ServerInterface.AcquireLease(w, r, params)
		return
	}
	body, ok := decodeAcquire(rb.data)
	if !ok {
		f.ServerInterface.AcquireLease(w, r, params)
		return
	}
	resp, err := f.ctl.AcquireLease(r.Context(), server.AcquireLeaseRequestObject{Params: params, Body: &body})
	if err != nil {
		writeProblem(w, r, f.g.log, err) // as the strict handler's ResponseErrorHandlerFunc
		return
	}
	if lease, ok := resp.(server.AcquireLease201JSONResponse); ok {
		buf := leaseBuffers.Get().(*[]byte)
		if b, ok := appendLease((*buf)[:0], api.Lease(lease)); ok {
			// The length too, which net/http would count itself (the body
			// is one short write): the head then goes out at once, without
			// the snapshot of the header a head held back for the body takes.
			h := w.Header()
			h["Content-Type"] = jsonContentType
			h["Content-Length"] = []string{strconv.Itoa(len(b))}
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(b)
			*buf = b
			leaseBuffers.Put(buf)
			return
		}
		leaseBuffers.Put(buf)
	}
	if err := resp.VisitAcquireLeaseResponse(w); err != nil {
		writeProblem(w, r, f.g.log, err)
	}
}

// readBody is a control call's body once controlBody has read it whole:
// the generated decoder reads it as any body, fastAcquire takes its bytes.
type readBody struct {
	bytes.Reader // by value: one allocation for both
	data         []byte
}

func (*readBody) Close() error { return nil }

// jsonContentType is the 201 answer's Content-Type, set without the
// slice Header.Set allocates for each answer. It is shared: net/http copies
// the handler's header when the answer starts (Header.Clone) and never
// changes a value in place, and nothing here does either.
var jsonContentType = []string{"application/json"}

// leaseBuffers holds the buffers answers are written into.
var leaseBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// decodeAcquire decodes data, a complete body, when it has the one shape
// whose decoding by encoding/json it can tell exactly (see above); ok is
// false for anything else, which the generated decoder then judges.
func decodeAcquire(data []byte) (body api.AcquireLeaseJSONRequestBody, ok bool) {
	const (
		seenResource = 1 << iota
		seenHolder
		seenTTL
		seenWait
	)
	var seen uint8
	i := skipSpace(data, 0)
	if i == len(data) || data[i] != '{' {
		return body, false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return body, skipSpace(data, i+1) == len(data)
	}
	for {
		a, b, next, ok := plainString(data, i)
		if !ok {
			return body, false
		}
		key := data[a:b]
		i = skipSpace(data, next)
		if i == len(data) || data[i] != ':' {
			return body, false
		}
		i = skipSpace(data, i+1)
		var bit uint8
		switch {
		case string(key) == "resource":
			bit = seenResource
			a, b, next, ok = plainString(data, i)
			body.Resource = string(data[a:b])
		case string(key) == "holder":
			bit = seenHolder
			a, b, next, ok = plainString(data, i)
			s := string(data[a:b])
			body.Holder = &s
		case string(key) == "ttl_ms":
			bit = seenTTL
			body.TtlMs, next, ok = plainInt(data, i)
		case string(key) == "wait_ms":
			bit = seenWait
			var n int64
			n, next, ok = plainInt(data, i)
			body.WaitMs = &n
		default:
			return body, false
		}
		if !ok || seen&bit != 0 {
			return body, false
		}
		seen |= bit
		i = skipSpace(data, next)
		if i == len(data) {
			return body, false
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
		case '}':
			return body, skipSpace(data, i+1) == len(data)
		default:
			return body, false
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func skipSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// plainString finds a JSON string at data[i] that needs no unescaping: no
// backslash, no control byte, valid UTF-8 (encoding/json would replace
// invalid bytes). Its content is data[a:b]; next is the index after it.
func plainString(data []byte, i int) (a, b, next int, ok bool) {
	if i == len(data) || data[i] != '"' {
		return 0, 0, 0, false
	}
	a = i + 1
	ascii := true
	for j := a; j < len(data); j++ {
		c := data[j]
		switch {
		case c == '"':
			if !ascii && !utf8.Valid(data[a:j]) {
				return 0, 0, 0, false
			}
			return a, j, j + 1, true
		case c == '\\' || c < 0x20:
			return 0, 0, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return 0, 0, 0, false
}

// plainInt reads a JSON integer at data[i]: an optional minus, then 0 or a
// digit string without a leading zero, with no fraction or exponent (which
// encoding/json refuses for an int64), fitting int64.
func plainInt(data []byte, i int) (n int64, next int, ok bool) {
	neg := false
	if i < len(data) && data[i] == '-' {
		neg = true
		i++
	}
	start := i
	var u uint64
	for i < len(data) && data[i] >= '0' && data[i] <= '9' {
		if i-start == 19 { // more digits than any int64 has
			return 0, 0, false
		}
		u = u*10 + uint64(data[i]-'0')
		i++
	}
	switch {
	case i == start, data[start] == '0' && i-start > 1:
		return 0, 0, false
	case i < len(data) && (data[i] == '.' || data[i] == 'e' || data[i] == 'E'):
		return 0, 0, false
	case neg && u > 1<<63, !neg && u > 1<<63-1:
		return 0, 0, false
	}
	if neg {
		return -int64(u), i, true // -int64(1<<63) wraps to itself, the minimum
	}
	return int64(u), i, true
}

// appendLease appends l as the generated json.Encoder writes it (fields in
// declaration order, RFC 3339 times, a newline at the end), when none of
// its strings needs escaping; ok is false otherwise.
func appendLease(b []byte, l api.Lease) ([]byte, bool) {
	if !plainJSON(l.Holder) || !plainJSON(l.LeaseId) || !plainJSON(l.Resource) || !plainJSON(string(l.State)) {
		return b, false
	}
	var ok bool
	b = append(b, `{"expires_at":`...)
	if b, ok = appendTime(b, l.ExpiresAt); !ok {
		return b, false
	}
	b = append(b, `,"granted_at":`...)
	if b, ok = appendTime(b, l.GrantedAt); !ok {
		return b, false
	}
	b = append(b, `,"holder":"`...)
	b = append(b, l.Holder...)
	b = append(b, `","lease_id":"`...)
	b = append(b, l.LeaseId...)
	b = append(b, '"')
	if l.ReleasedAt != nil {
		b = append(b, `,"released_at":`...)
		if b, ok = appendTime(b, *l.ReleasedAt); !ok {
			return b, false
		}
	}
	b = append(b, `,"resource":"`...)
	b = append(b, l.Resource...)
	b = append(b, `","state":"`...)
	b = append(b, l.State...)
	b = append(b, `","token":`...)
	b = strconv.AppendInt(b, l.Token, 10)
	b = append(b, `,"ttl_ms":`...)
	b = strconv.AppendInt(b, l.TtlMs, 10)
	b = append(b, "}\n"...)
	return b, true
}

func appendTime(b []byte, t time.Time) ([]byte, bool) {
	b = append(b, '"')
	b, err := t.AppendText(b) // what Time.MarshalJSON writes between its quotes
	if err != nil {
		return b, false
	}
	return append(b, '"'), true
}

// plainJSON reports whether encoding/json writes s as is between quotes:
// printable ASCII, none of the bytes it escapes (" \ and, escaping HTML as
// the Encoder does by default, < > &).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// pathLeases is where leases are acquired (the spec's AcquireLease).
const pathLeases = "/v1/leases"
