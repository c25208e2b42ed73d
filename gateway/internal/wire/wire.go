// Package wire is the HTTP/1.1 head as the listener's loop and the engine
// see it on the wire: HeadEnd finds where a head whose lines all end in
// CRLF stops (the loop's requests, the engine's informational answers),
// and WriteFields writes the fields of a head as net/http writes
// them (Header.WriteSubset: sorted by name, invalid names dropped, CR and
// LF in a value turned to spaces, the value trimmed), for the two places
// that write heads of their own: the listener's loop answering a client
// (package framing) and the engine sending a request upstream (package
// engine). It is WriteSubset's output byte for byte, without its pooled
// sorter, its sort closure and a replacer per value: a fenced write writes
// two heads, and WriteSubset was a tenth of the loop's own work.
package wire

import (
	"bufio"
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// WriteFields writes the fields of h whose names exclude does not hold, as
// Header.WriteSubset would.
func WriteFields(w *bufio.Writer, h http.Header, exclude map[string]bool) {
	var names [16]string // a head of more fields sorts on the heap
	keys := names[:0]
	for k := range h {
		if !exclude[k] {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !httpguts.ValidHeaderFieldName(k) {
			continue // WriteSubset drops it: a handler has no error to hear
		}
		for _, v := range h[k] {
			_, _ = w.WriteString(k)
			_, _ = w.WriteString(": ")
			_, _ = w.WriteString(Value(v))
			_, _ = w.WriteString("\r\n")
		}
	}
}

// Value is a field value as net/http writes it: CR and LF turned to
// spaces, then trimmed of spaces and tabs.
func Value(v string) string {
	if strings.ContainsAny(v, "\r\n") {
		v = newlineToSpace.Replace(v)
	}
	return textproto.TrimString(v)
}

var newlineToSpace = strings.NewReplacer("\n", " ", "\r", " ")

// HeadEnd is the length of the head at the start of buf, through its empty
// line, if every line of it ends with CRLF; 0 if the head is not whole, -1
// if it has a bare LF (net/http's parsers take one; the callers leave such
// a head to them).
func HeadEnd(buf []byte) int {
	for i := 0; i < len(buf); i++ {
		if buf[i] != '\n' {
			continue
		}
		if i == 0 || buf[i-1] != '\r' {
			return -1
		}
		if i >= 3 && buf[i-2] == '\n' && buf[i-3] == '\r' {
			return i + 1
		}
	}
	return 0
}
