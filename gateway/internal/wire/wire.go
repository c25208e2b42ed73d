// Package wire is the HTTP/1.1 head as the listener's loop and the engine
// see it on the wire: HeadEnd finds where a head whose lines all end in
// CRLF stops (the loop's requests, the engine's informational answers),
// and WriteFields (from a header map) and WriteSorted (from a list of
// Fields) write the fields of a head as net/http writes them
// (Header.WriteSubset: sorted by name, invalid names dropped, CR and LF
// in a value turned to spaces, the value trimmed), for the two places
// that write heads of their own: the listener's loop answering a client
// (package framing) and the engine sending a request upstream (package
// engine, whose header the gateway builds as Fields). It is WriteSubset's
// output byte for byte, without its pooled sorter, its sort closure and a
// replacer per value: a fenced write writes two heads, and WriteSubset was
// a tenth of the loop's own work.
package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math/bits"
	"net/http"
	"net/textproto"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// WriteFields writes the fields of h whose names are not in exclude, as
// Header.WriteSubset would with those names excluded.
func WriteFields(w *bufio.Writer, h http.Header, exclude []string) {
	// The fields in name order (Fields.Sort), each with its values: no
	// second lookup.
	var fields [16]Field // a head of more fields sorts on the heap
	sorted := Fields(fields[:0])
	ex := exclusionOf(exclude)
	for k, vv := range h {
		if !ex.has(k) {
			sorted = append(sorted, Field{k, vv})
		}
	}
	sorted.Sort()
	writeLines(w, sorted, nil, nil)
}

// writeLines writes the lines of fields, sorted (or in the order at
// gives, if it is not nil: the place of each field in name order), whose
// names are not in exclude: WriteSubset's rules for each (an invalid name
// dropped, the value as Value makes it).
//
// The lines are put in the writer's free space and written with one
// Write, which copies them onto themselves: a Write a line was 220
// instructions of a fenced write's two heads. A line that does not fit
// goes out in four writes, after the lines put before it, so the writer
// flushes where and as it did with a Write a line.
func writeLines(w *bufio.Writer, fields Fields, at []uint8, exclude []string) {
	ex := exclusionOf(exclude)
	b := w.AvailableBuffer()
	for k := range fields {
		i := k
		if at != nil {
			i = int(at[k])
		}
		name, values := fields[i].Name, fields[i].Values // not the field copied: 40 bytes a field
		if ex.has(name) || !ValidName(name) {
			continue // WriteSubset drops an invalid name: a handler has no error to hear
		}
		for _, v := range values {
			if !plain(v) { // Value, without a call for a plain value
				v = Value(v)
			}
			if len(name)+len(v)+4 > cap(b)-len(b) {
				b = writeLine(w, b, name, v)
				continue
			}
			b = append(b, name...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	if len(b) > 0 {
		_, _ = w.Write(b)
	}
}

// writeLine writes the lines in b, the writer's free space, and then a
// line that does not fit there in four writes; it returns the free space
// after them. A call of its own, it leaves writeLines' loop 20
// instructions shorter for the upstream head.
func writeLine(w *bufio.Writer, b []byte, name, v string) []byte {
	_, _ = w.Write(b)
	_, _ = w.WriteString(name)
	_, _ = w.WriteString(": ")
	_, _ = w.WriteString(v)
	_, _ = w.WriteString("\r\n")
	return w.AvailableBuffer()
}

// exclusion is a set of names to leave out (Header.WriteSubset's
// exclude), for heads checked against it field by field: a field whose
// name's length no excluded name has is let through on one bit test, and
// only names of an excluded length are compared. The upstream head's ten
// fields, each compared with its five exclusions (slices.Contains, a
// call a field), cost 450 instructions more.
type exclusion struct {
	names []string
	lens  uint64 // bit n set: some excluded name has length n, or n ≥ 63
}

func exclusionOf(names []string) exclusion {
	e := exclusion{names: names}
	for _, x := range names {
		e.lens |= 1 << min(len(x), 63)
	}
	return e
}

func (e exclusion) has(name string) bool {
	if e.lens&(1<<min(len(name), 63)) == 0 {
		return false
	}
	for _, x := range e.names {
		if x == name {
			return true
		}
	}
	return false
}

// ValidName is httpguts.ValidHeaderFieldName: a non-empty token. It reads
// the name a byte at a time where the other decodes runes, which cost
// more than the rest of a field's writing: no byte of a multi-byte rune,
// nor of an invalid one, is a token byte, so the two agree.
func ValidName(name string) bool {
	switch name {
	case "Content-Type", "Content-Length", "Accept-Encoding", "Date", "Fencing-Token", "Fencing-Resource",
		"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Traceparent":
		// The names of nearly every fenced write's two heads (the answer's
		// and the request upstream, with what the gateway sets): a
		// comparison each, where the loop below reads every byte.
		return true
	case "":
		return false
	}
	for i := 0; i < len(name); i++ {
		if !TokenByte[name[i]] {
			return false
		}
	}
	return true
}

// TokenByte: the bytes of a token (RFC 9110 5.6.2), a field name's or a
// method's: httpguts.IsTokenRune's, a load each where that decodes a rune.
var TokenByte = func() (t [256]bool) {
	for b := range 0x80 {
		t[b] = httpguts.IsTokenRune(rune(b))
	}
	return t
}()

// CanonicalKey is textproto.CanonicalMIMEHeaderKey(name), with the names
// a fenced write's request and answer commonly carry, already canonical,
// taken as they are: CanonicalMIMEHeaderKey checks a canonical name byte by
// byte before it returns it, and that check was the largest single cost
// of parsing a head (FuzzCanonicalKey holds the two to the same result).
func CanonicalKey(name string) string {
	switch name {
	case "Host", "Content-Length", "Content-Type", "User-Agent", "Accept-Encoding", "Accept",
		"Connection", "Date", "Server", "Authorization", "Traceparent", "Tracestate",
		"Fencing-Lease", "Idempotency-Key", "Cache-Control", "Last-Modified", "Etag":
		return name
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}

// Get is Header.Get for a name already canonical (every constant name
// the road looks up): the first value, without canonicalizing the name
// again, which was most of what Get cost.
func Get(h http.Header, name string) string { return First(h[name]) }

// First is a field's first value, as Header.Get has it: for a field whose
// values were found without a lookup (a pass over the header).
func First(vv []string) string {
	if len(vv) > 0 {
		return vv[0]
	}
	return ""
}

// Value is a field value as net/http writes it: CR and LF turned to
// spaces, then trimmed of spaces and tabs.
func Value(v string) string {
	if plain(v) {
		return v // the common value, as it is
	}
	if strings.IndexByte(v, '\r') >= 0 || strings.IndexByte(v, '\n') >= 0 { // ContainsAny's general search cost more
		v = newlineToSpace.Replace(v)
	}
	return textproto.TrimString(v)
}

// Unprintable is the index of the first byte of b from i that is below
// 0x20 or above 0x7e (a CR, a tab, obs-text, a control byte), len(b) if
// none: where a field value ends, or must be looked at, for the two heads
// the road parses itself (the loop's request, package framing; the
// engine's answer, package engine). Values (a lease, a trace) are most of
// a head's bytes, so eight are read at a time: the lowest byte the exact
// tests of "Bit Twiddling Hacks" (hasless and hasmore) flag is the first
// such byte, as each test's false hits lie above one of its true ones.
func Unprintable(b []byte, i int) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for i+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[i:])
		if m := ((x-0x20*ones)&^x | (x + ones | x)) & highs; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for ; i < len(b); i++ {
		if c := b[i]; c < ' ' || c > 0x7e {
			return i
		}
	}
	return len(b)
}

// plain reports whether Value leaves v as it is because nothing in it
// could change: no byte below 0x20 (so no CR, LF or tab), and no space at
// either end. Eight bytes are checked at a time, none below 0x20 (the
// exact test of "Bit Twiddling Hacks", hasless; a byte from 0x80 up does
// not trip it, and Value keeps it); the last eight overlap the eight
// before where a loop took the rest a byte at a time (90 instructions of
// the upstream head's eight values). A false answer only costs the
// general path.
func plain(v string) bool {
	n := len(v)
	if n == 0 {
		return true
	}
	if v[0] == ' ' || v[n-1] == ' ' {
		return false
	}
	if n < 8 {
		for i := 0; i < n; i++ {
			if v[i] < ' ' {
				return false
			}
		}
		return true
	}
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for i := 0; i < n-8; i += 8 {
		if x := word(v, i); (x-0x20*ones)&^x&highs != 0 {
			return false
		}
	}
	x := word(v, n-8)
	return (x-0x20*ones)&^x&highs == 0
}

// word is the eight bytes of s from i, little-endian: one load.
func word(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

var newlineToSpace = strings.NewReplacer("\n", " ", "\r", " ")

// HeadEnd is the length of the head at the start of buf, through its empty
// line, if every line of it ends with CRLF; 0 if the head is not whole, -1
// if it has a bare LF (net/http's parsers take one; the callers leave such
// a head to them). It jumps from LF to LF (bytes.IndexByte): a byte-by-byte
// loop over each head, twice per request, was 3 % of a fenced write's
// instructions.
func HeadEnd(buf []byte) int {
	i := 0
	for {
		j := bytes.IndexByte(buf[i:], '\n')
		if j < 0 {
			return 0
		}
		i += j
		if i == 0 || buf[i-1] != '\r' {
			return -1
		}
		if i >= 3 && buf[i-2] == '\n' && buf[i-3] == '\r' {
			return i + 1
		}
		i++
	}
}
