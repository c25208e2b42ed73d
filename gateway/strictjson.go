package gateway

import (
	"bytes"
	"encoding/json"
	"math/bits"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/fencegw/fencegw/api"
	"github.com/fencegw/fencegw/tokens"
)

// Strict request bodies. encoding/json, which the generated strict server
// decodes with, ignores members it has no field for and takes the last of
// a repeated member, and it matches names case-insensitively: a worker
// that sends "waitms" believes it asked to wait and is answered at once.
// controlBody therefore checks every control body's top-level member names
// against the call's fields before any decoder sees it (the spec says
// additionalProperties: false): an unknown member, or one given twice, is
// 400 invalid_request naming it. The fields are the generated request
// types' JSON names, so the spec stays their one source.

// bodyFields are the member names one call's body may hold.
type bodyFields struct {
	names []string // at most 8 (a bit each for duplicates)
	// required has a bit for each of names the call needs: the spec's
	// required members, which the generated types tag without omitempty.
	required uint8
	list     string // for messages: "holder, resource, ttl_ms, wait_ms"
}

var (
	acquireFields = fieldsOf(api.AcquireRequest{})
	renewFields   = fieldsOf(api.RenewRequest{})
	noFields      = bodyFields{}
)

// fieldsOf lists the JSON names of a generated request type's fields.
func fieldsOf(v any) bodyFields {
	var f bodyFields
	t := reflect.TypeOf(v)
	for i := range t.NumField() {
		name, opts, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			if !slices.Contains(strings.Split(opts, ","), "omitempty") {
				f.required |= 1 << len(f.names)
			}
			f.names = append(f.names, name)
		}
	}
	if len(f.names) > 8 {
		panic("gateway: a request body with more than 8 fields")
	}
	f.list = strings.Join(f.names, ", ")
	return f
}

// fieldsFor is the body fields of the control call r (a POST): acquire
// and renew take a body; revoke takes none, so any member of a
// body sent to them is unknown.
func fieldsFor(r *http.Request) bodyFields {
	switch p := r.URL.Path; {
	case p == pathLeases:
		return acquireFields
	case strings.HasPrefix(p, "/v1/leases/") && strings.HasSuffix(p, "/renew"):
		return renewFields
	}
	return noFields
}

// checkFields refuses a body whose top-level object has a member that is
// not one of f's, or has one twice, or lacks one the call needs (absent
// or null: encoding/json would decode either to a zero the domain then
// judges, "ttl_ms: must be between 100 and 3600000" for a forgotten
// ttl_ms). data must be valid JSON (json.Valid);
// a body that is not an object is left to the decoder, whose errors say
// what it should be, and so is one that is not JSON (no panic on it). It does not allocate unless a member name holds an
// escape or is refused.
func checkFields(data []byte, f bodyFields) error {
	i := skipSpace(data, 0)
	if i == len(data) || data[i] != '{' {
		return nil
	}
	var seen, given uint8 // given: seen with a value other than null
	i = skipSpace(data, i+1)
	for i < len(data) && data[i] != '}' {
		if data[i] != '"' {
			return nil // not JSON after all: the decoder says so
		}
		end := stringEnd(data, i)
		if end-1 <= i || data[end-1] != '"' {
			return nil
		}
		key := data[i+1 : end-1]
		n := -1
		for j, want := range f.names {
			if string(key) == want { // compared in place, not allocated
				n = j
				break
			}
		}
		name := ""
		if n < 0 || seen&(1<<n) != 0 {
			name = string(key)
		}
		if n < 0 && strings.IndexByte(name, '\\') >= 0 {
			// An escaped name: encoding/json would match it unescaped
			// (and case-insensitively, which this never does).
			var s string
			if json.Unmarshal(data[i:end], &s) == nil {
				name = s
				for j, want := range f.names {
					if name == want {
						n = j
					}
				}
			}
		}
		switch {
		case n < 0:
			detail := "is not a field of this call; it takes no body"
			if f.list != "" {
				detail = "is not a field of this call (its fields: " + f.list + ")"
			}
			return tokens.Invalid(quoteField(name), detail)
		case seen&(1<<n) != 0:
			return tokens.Invalid(name, "is given twice")
		}
		seen |= 1 << n
		i = skipSpace(data, end)
		if i == len(data) || data[i] != ':' {
			return nil
		}
		i = skipSpace(data, i+1)
		if !bytes.HasPrefix(data[i:], []byte("null")) {
			given |= 1 << n
		}
		i = skipSpace(data, valueEnd(data, i))
		if i < len(data) && data[i] == ',' {
			i = skipSpace(data, i+1)
		}
	}
	if i == len(data) {
		return nil // not JSON after all: the decoder says so
	}
	if missing := f.required &^ given; missing != 0 {
		return tokens.Invalid(f.names[bits.TrailingZeros8(missing)], "is required")
	}
	return nil
}

// quoteField names an unknown member in a problem: as sent if it is a
// short printable name, else quoted and cut.
func quoteField(name string) string {
	name = truncateUTF8(name, 64)
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c == '"' || c == '\\' || c >= 0x7f {
			return strconv.Quote(name)
		}
	}
	return name
}

// stringEnd returns the index just past the JSON string starting at
// data[i] (a '"').
func stringEnd(data []byte, i int) int {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(data)
}

// valueEnd returns the index just past the JSON value starting at data[i]
// (valid JSON: strings, numbers, literals, objects and arrays skipped
// whole).
func valueEnd(data []byte, i int) int {
	if i >= len(data) {
		return i
	}
	switch data[i] {
	case '"':
		return stringEnd(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				j = stringEnd(data, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(data)
	}
	j := i
	for j < len(data) && !strings.ContainsRune(",}] \t\r\n", rune(data[j])) {
		j++
	}
	return j
}
