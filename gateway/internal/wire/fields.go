package wire

import (
	"bufio"
	"math/bits"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"unsafe"
)

// insertionMax is the most fields Sort sorts by insertion.
const insertionMax = 32

// Field is one field of a head: its name (as a header map keys it) and
// its values.
type Field struct {
	Name   string
	Values []string
}

// Fields is the header of the request the gateway sends upstream, built
// as a list rather than a map: the road copies a client's fields into
// it, drops and sets a few by name, and writes it once, sorted, so a map's
// hashing, growth, clearing and unordered walk (which WriteFields must
// then sort) bought it nothing. It keeps a map's rules: one entry per name
// (Set replaces, Add is for names known to be absent), names compared as
// they are. Header is the map, for the one writer that needs one
// (Request.Write, for a body that streams).
type Fields []Field

// FieldsOf returns h's fields, sorted by name.
func FieldsOf(h http.Header) Fields {
	fs := make(Fields, 0, len(h))
	for k, vv := range h {
		fs = append(fs, Field{k, vv})
	}
	fs.Sort()
	return fs
}

// Add appends a field whose name is not in fs.
func (fs *Fields) Add(name string, values []string) { *fs = append(*fs, Field{name, values}) }

// Set sets the values of the field name, replacing any there.
func (fs *Fields) Set(name string, values []string) {
	if i := fs.Index(name); i >= 0 {
		(*fs)[i].Values = values
		return
	}
	fs.Add(name, values)
}

// Del removes the field name, if it is there.
func (fs *Fields) Del(name string) {
	if i := fs.Index(name); i >= 0 {
		fs.remove(i)
	}
}

// DelFunc removes every field whose name drop reports.
func (fs *Fields) DelFunc(drop func(name string) bool) {
	for i := 0; i < len(*fs); {
		if drop((*fs)[i].Name) {
			fs.remove(i)
			continue
		}
		i++
	}
}

// remove takes out the field at i, keeping the order of the rest (a
// sorted list stays sorted).
func (fs *Fields) remove(i int) {
	s := *fs
	copy(s[i:], s[i+1:])
	s[len(s)-1] = Field{}
	*fs = s[:len(s)-1]
}

// Lookup returns the values of the field name, and whether it is there.
func (fs Fields) Lookup(name string) ([]string, bool) {
	if i := fs.Index(name); i >= 0 {
		return fs[i].Values, true
	}
	return nil, false
}

// Index is the place of the field name in fs, -1 if it is not there.
func (fs Fields) Index(name string) int {
	for i := range fs {
		if fs[i].Name == name {
			return i
		}
	}
	return -1
}

// Sort puts the fields in name order, as Header.WriteSubset writes them:
// by insertion for a head of a few fields, else by slices.SortFunc. A
// client may send thousands of fields within the header limit (13,000
// empty ones in 64 KiB), and insertion's n² took 0.6 s of CPU to sort
// those, per request.
//
// Insertion compares each name's first eight bytes as one number
// (prefixKey), which orders two names as their bytes do wherever the
// numbers differ; only names alike that far (X-Forwarded-For and
// X-Forwarded-Host) are compared as strings. A string comparison per step
// was about 1 % of a fenced write's instructions (scripts/callgrind-servers.sh);
// keys of sixteen bytes, or sorting the fields' places rather than the
// fields, cost more than they saved.
func (fs Fields) Sort() { fs.sort(nil) }

// sort is Sort; at, if not nil, is given for each place in name order the
// place its field had (fs has at most orderMax fields).
func (fs Fields) sort(at *[orderMax]uint8) {
	if len(fs) > insertionMax {
		slices.SortFunc(fs, compareNames)
		return
	}
	if at != nil {
		for i := range fs {
			at[i] = uint8(i)
		}
	}
	var keys [insertionMax]uint64
	for i := range fs {
		// prefixKey, its common case inline: too large to be inlined, it
		// cost a call a field (100 instructions of the upstream head).
		if name := fs[i].Name; len(name) >= 8 {
			keys[i] = bits.ReverseBytes64(word(name, 0))
		} else {
			keys[i] = prefixKey(name)
		}
	}
	// Each field is taken out, the fields before it that sort after it
	// moved up a place, and it is put in the gap: a move a step where a
	// swap was two. The upstream head, whose gateway-set fields come after
	// the client's (about twenty steps), costs 97 instructions fewer; the
	// answer's four fields, in a map's order, 23 more.
	for i := 1; i < len(fs); i++ {
		k, f := keys[i], fs[i]
		j := i
		for ; j > 0; j-- {
			if a := keys[j-1]; a < k || a == k && fs[j-1].Name <= f.Name {
				break
			}
			fs[j], keys[j] = fs[j-1], keys[j-1]
		}
		if j < i {
			fs[j], keys[j] = f, k
			if at != nil {
				p := at[i]
				copy(at[j+1:i+1], at[j:i])
				at[j] = p
			}
		}
	}
}

// prefixKey is name's first eight bytes, big-endian, zeros past its end:
// of two names whose keys differ, the smaller key's name sorts first.
func prefixKey(name string) uint64 {
	if len(name) >= 8 {
		return bits.ReverseBytes64(word(name, 0))
	}
	var k uint64
	for i := range len(name) {
		k |= uint64(name[i]) << (56 - 8*i)
	}
	return k
}

// compareNames orders a large head's fields (Sort). A variable so that
// TestLargeHeadSortsInNLogN can count its calls: a sort that went back to
// n² comparisons for a large head fails that test, not a timing.
var compareNames = func(a, b Field) int { return strings.Compare(a.Name, b.Name) }

// Header is fs as a header map.
func (fs Fields) Header() http.Header {
	h := make(http.Header, len(fs))
	for _, f := range fs {
		h[f.Name] = f.Values
	}
	return h
}

// Carrier lets a trace propagator (OpenTelemetry's TextMapCarrier) set
// its fields in fs, as propagation.HeaderCarrier sets them in a header
// map: names canonicalized, a value set replacing what was there.
type Carrier struct{ Fields *Fields }

// Get returns the first value of the field key names.
func (c Carrier) Get(key string) string {
	vv, _ := c.Fields.Lookup(textproto.CanonicalMIMEHeaderKey(key))
	return First(vv)
}

// Set sets the field key names to value alone.
func (c Carrier) Set(key, value string) {
	c.Fields.Set(textproto.CanonicalMIMEHeaderKey(key), []string{value})
}

// Keys returns the names of the fields.
func (c Carrier) Keys() []string {
	keys := make([]string, len(*c.Fields))
	for i, f := range *c.Fields {
		keys[i] = f.Name
	}
	return keys
}

// WriteSorted sorts fs and writes its fields whose names are not in
// exclude, as Header.WriteSubset would write fs.Header().
func WriteSorted(w *bufio.Writer, fs Fields, exclude []string) {
	fs.Sort()
	writeLines(w, fs, nil, exclude)
}

// orderMax is the most fields an Order keeps the order of.
const orderMax = 16

// Order is a connection's last head written through WriteSortedIn: its
// names, as they came, and the order they sort in. A connection's heads
// mostly have the same names in the same places each time (one client's
// requests sent on, one upstream's answers), and such a head is written
// in that order without being sorted: its names compared with the last
// head's, each mostly the very same string (the parsers' known names and
// the gateway's are constants, equal at their first byte), cost a
// fraction of Sort's keys, comparisons and moves (a fenced write's two
// heads, scripts/callgrind-servers.sh: about 950 instructions).
//
// A name cut from a head's own bytes (one the listener's loop parsed and
// does not know) keeps that head's string alive until the connection's
// next head: 4 KiB at most, the loop's buffer, which a head it parses
// fits in. Names Go's parser read are strings of their own. The zero Order
// has no head.
type Order struct {
	n     int // the last head's fields; 0: none kept
	names [orderMax]string
	at    [orderMax]uint8 // the place of each field in name order
}

// WriteSortedIn is WriteSorted for a connection's head: the same bytes,
// in o's order if fs has o's names in o's places, else sorted, and its
// order then kept in o. fs is left in name order or as it was. A nil o is
// WriteSorted.
func WriteSortedIn(w *bufio.Writer, fs Fields, exclude []string, o *Order) {
	if o == nil {
		WriteSorted(w, fs, exclude)
		return
	}
	if o.same(fs) {
		writeLines(w, fs, o.at[:len(fs)], exclude)
		return
	}
	if len(fs) > orderMax {
		o.n = 0
		WriteSorted(w, fs, exclude)
		return
	}
	for i := range fs {
		o.names[i] = fs[i].Name
	}
	if o.n > len(fs) {
		clear(o.names[len(fs):o.n]) // no name of an older head kept alive
	}
	o.n = len(fs)
	fs.sort(&o.at)
	writeLines(w, fs, nil, exclude)
}

// same reports whether fs has o's names in o's places.
func (o *Order) same(fs Fields) bool {
	if len(fs) != o.n || o.n == 0 {
		return false
	}
	for i := range fs {
		// The same string is the common case: its first byte's address
		// compared here, where == calls memequal a name.
		a, b := fs[i].Name, o.names[i]
		if len(a) != len(b) || unsafe.StringData(a) != unsafe.StringData(b) && a != b {
			return false
		}
	}
	return true
}
