package wire

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/bits"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
)

// FuzzFieldsMatchHeader: a header built as Fields, by any sequence of
// Add (of an absent name), Set, Del and DelFunc, writes (WriteSorted)
// what the same steps on a header map write through WriteSubset, and
// Header is that map. ops is a list of steps "op name=value" separated by
// "|": + adds, = sets, - deletes, ~ deletes every name with that prefix.
func FuzzFieldsMatchHeader(f *testing.F) {
	for _, s := range []string{
		"+X-A=1|+X-B=2|=X-A=3|-X-B|=Fencing-Token=7",
		"+Content-Length=5|+User-Agent=w|=Host=h|~X-|+X-Forwarded-For=1|=X-Forwarded-For=2",
		"+Z=1|+Y=2|+X=3|+W=4|+V=5|+U=6|+T=7|+S=8|+R=9|+Q=10|+P=11|+O=12|+N=13|+M=14|+L=15|+K=16|+J=17|=A=0",
		"+bad name=1|+x-low=a\r\nb|=x-low= pad |-nothing|~",
		// names alike in their first eight bytes or more, and names that are
		// others' beginnings (Sort's prefixKey)
		"+X-Forwarded-Host=1|+X-Forwarded-For=2|+X-Forwar=3|+X-Forwarded=4|+X-Forwa=5|+X=6|+Xa=7|+X-Forwarded-Fo=8",
		"+X-Forwarded-Host-A=1|+X-Forwarded-Host=2|+X-Forwarded-Host-=3|+X-Forwarded-HostB=4|+X-Forwarded-Hos=5",
		// lines of 15, 16 and 17 bytes (the writer below holds 16), and
		// names of an excluded name's length (Trailer, Host)
		"+X-A=12345678|+X-B=123456789|+X-C=1234567890|+Trailers=1|+Hosts=2|+User-Agent=3|+User-Agenu=4",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ops string) {
		var fs Fields
		h := http.Header{}
		for _, op := range strings.Split(ops, "|") {
			if op == "" {
				continue
			}
			name, value, _ := strings.Cut(op[1:], "=")
			switch op[0] {
			case '+':
				if _, ok := h[name]; ok {
					continue // Add is for absent names only
				}
				fs.Add(name, []string{value})
				h[name] = []string{value}
			case '=':
				fs.Set(name, []string{value})
				h[name] = []string{value}
			case '-':
				fs.Del(name)
				delete(h, name)
			case '~':
				drop := func(k string) bool { return strings.HasPrefix(k, name) }
				fs.DelFunc(drop)
				for k := range h {
					if drop(k) {
						delete(h, k)
					}
				}
			}
		}
		if len(fs) != len(h) {
			t.Fatalf("%d fields, the map has %d", len(fs), len(h))
		}
		for k, vv := range fs.Header() {
			if got, ok := fs.Lookup(k); !ok || !slices.Equal(got, vv) || !slices.Equal(h[k], vv) {
				t.Fatalf("field %q: Lookup %q, Header %q, the map %q", k, got, vv, h[k])
			}
		}
		exclude := []string{"Host", "User-Agent", "Content-Length"}
		excludeMap := map[string]bool{"Host": true, "User-Agent": true, "Content-Length": true}
		var want, got bytes.Buffer
		if err := h.WriteSubset(&want, excludeMap); err != nil {
			t.Fatal(err)
		}
		bw := bufio.NewWriterSize(&got, 16) // lines that do not fit too
		WriteSorted(bw, fs, exclude)
		_ = bw.Flush()
		if got.String() != want.String() {
			t.Fatalf("WriteSorted wrote\n%q\nWriteSubset\n%q", got.String(), want.String())
		}
		want.Reset()
		if err := h.WriteSubset(&want, nil); err != nil {
			t.Fatal(err)
		}
		for _, exclude := range [][]string{nil, {}} {
			got.Reset()
			bw.Reset(&got)
			WriteSorted(bw, fs, exclude)
			_ = bw.Flush()
			if got.String() != want.String() {
				t.Fatalf("WriteSorted, exclude %#v, wrote\n%q\nWriteSubset\n%q", exclude, got.String(), want.String())
			}
		}
	})
}

// TestCarrierMatchesHeaderCarrier: a propagator sets in Fields (through
// Carrier) what it sets in a header map through HeaderCarrier, and
// reads it back the same way.
func TestCarrierMatchesHeaderCarrier(t *testing.T) {
	h := http.Header{"Traceparent": {"old"}, "X-A": {"1"}}
	fs := FieldsOf(h)
	hc, fc := propagation.HeaderCarrier(h), Carrier{Fields: &fs}
	for _, kv := range [][2]string{{"traceparent", "00-abc-def-01"}, {"tracestate", "k=v"}, {"TRACEPARENT", "00-new-01"}} {
		hc.Set(kv[0], kv[1])
		fc.Set(kv[0], kv[1])
	}
	var want, got bytes.Buffer
	_ = h.Write(&want)
	bw := bufio.NewWriter(&got)
	WriteSorted(bw, fs, nil)
	_ = bw.Flush()
	if got.String() != want.String() {
		t.Fatalf("Carrier set\n%q\nHeaderCarrier\n%q", got.String(), want.String())
	}
	for _, k := range []string{"traceparent", "Tracestate", "x-a", "absent"} {
		if hc.Get(k) != fc.Get(k) {
			t.Errorf("Get(%q): %q, HeaderCarrier %q", k, fc.Get(k), hc.Get(k))
		}
	}
	if len(fc.Keys()) != len(hc.Keys()) {
		t.Errorf("Keys: %q, HeaderCarrier %q", fc.Keys(), hc.Keys())
	}
}

// TestManyFieldsSortLikeWriteSubset: a head of more fields than Sort
// takes by insertion (a client may send thousands within the header
// limit) is written in WriteSubset's order too, from a list and from a map.
func TestManyFieldsSortLikeWriteSubset(t *testing.T) {
	h := http.Header{}
	for i := range 1000 {
		h["X-"+strconv.Itoa(i*7919%1000)+"-"+strconv.Itoa(i)] = []string{strconv.Itoa(i)}
	}
	var want bytes.Buffer
	if err := h.WriteSubset(&want, nil); err != nil {
		t.Fatal(err)
	}
	var fs Fields
	for k, vv := range h {
		fs.Add(k, vv)
	}
	for name, write := range map[string]func(*bufio.Writer){
		"WriteSorted": func(bw *bufio.Writer) { WriteSorted(bw, fs, nil) },
		"WriteFields": func(bw *bufio.Writer) { WriteFields(bw, h, nil) },
	} {
		var got bytes.Buffer
		bw := bufio.NewWriter(&got)
		write(bw)
		_ = bw.Flush()
		if got.String() != want.String() {
			t.Errorf("%s wrote 1,000 fields otherwise than WriteSubset", name)
		}
	}
}

// TestLargeHeadSortsInNLogN: a head of 13,000 fields (about what the
// gateway's 64 KiB header limit holds) is sorted with O(n log n)
// comparisons, counted rather than timed. Sorted by insertion, as a head of
// a few fields is, it took 0.6 s of CPU a request, and its comparisons
// (inline, uncounted) leave the count at zero: that fails too.
func TestLargeHeadSortsInNLogN(t *testing.T) {
	const n = 13000
	for name, order := range map[string]func(i int) int{
		"reversed":  func(i int) int { return n - i },
		"scattered": func(i int) int { return i * 7919 % n },
		"sorted":    func(i int) int { return i },
	} {
		fs := make(Fields, 0, n)
		for i := range n {
			fs.Add(fmt.Sprintf("X-%05d", order(i)), nil)
		}
		calls := 0
		compare := compareNames
		compareNames = func(a, b Field) int { calls++; return compare(a, b) }
		fs.Sort()
		compareNames = compare
		if !slices.IsSortedFunc(fs, compare) {
			t.Fatalf("%s: %d fields not sorted", name, n)
		}
		// pdqsort makes about n·log₂(n) comparisons (175,000 here); n²/4
		// would be 42 million.
		limit := 4 * n * bits.Len(n)
		if calls == 0 || calls > limit {
			t.Errorf("%s: sorting %d fields made %d counted comparisons, want 1 to %d (O(n log n))", name, n, calls, limit)
		}
	}
}

// BenchmarkWriteSortedManyFields: a head of 13,000 empty fields, about
// what 64 KiB holds (the gateway's header limit). By insertion it took
// 0.6 s a head.
func BenchmarkWriteSortedManyFields(b *testing.B) {
	var fs Fields
	for i := range 13000 {
		fs.Add("A"+strconv.Itoa(i*7919%13000)+"-"+strconv.Itoa(i), []string{""})
	}
	bw := bufio.NewWriter(io.Discard)
	c := make(Fields, len(fs))
	for b.Loop() {
		copy(c, fs)
		WriteSorted(bw, c, nil)
	}
}

// upstreamHead is the header of a fenced write's request upstream, as
// the gateway builds it: the client's fields (in the order Go's client
// sends them) then the gateway's own (in the order it adds them), User-Agent and Content-Length
// among them but written by the engine, not from the list.
func upstreamHead() Fields {
	var fs Fields
	for _, kv := range [][2]string{
		{"User-Agent", "Go-http-client/1.1"},
		{"Content-Length", "200"},
		{"Content-Type", "application/octet-stream"},
		{"Accept-Encoding", "gzip"},
		{"Fencing-Resource", "orders/eu-west/42"},
		{"Fencing-Token", "18446744073709551"},
		{"X-Forwarded-For", "127.0.0.1"},
		{"X-Forwarded-Host", "127.0.0.1:8080"},
		{"X-Forwarded-Proto", "http"},
		{"Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	} {
		fs.Add(kv[0], []string{kv[1]})
	}
	return fs
}

// BenchmarkWriteSortedUpstream: the request head a fenced write sends
// upstream (engine.writeHead's exclusions), from the order the gateway
// builds it in.
func BenchmarkWriteSortedUpstream(b *testing.B) {
	fs := upstreamHead()
	exclude := []string{"Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer"}
	bw := bufio.NewWriterSize(nil, 4096)
	c := make(Fields, len(fs))
	b.ReportAllocs()
	for b.Loop() {
		copy(c, fs)
		bw.Reset(nil)
		WriteSorted(bw, c, exclude)
	}
}

// BenchmarkWriteSortedInUpstream: BenchmarkWriteSortedUpstream's head on
// a connection, each head in the order the one before it came in.
func BenchmarkWriteSortedInUpstream(b *testing.B) {
	fs := upstreamHead()
	exclude := []string{"Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer"}
	bw := bufio.NewWriterSize(nil, 4096)
	c := make(Fields, len(fs))
	var o Order
	b.ReportAllocs()
	for b.Loop() {
		copy(c, fs)
		bw.Reset(nil)
		WriteSortedIn(bw, c, exclude, &o)
	}
}

// FuzzWriteSortedInMatchesWriteSorted: the heads of a connection, written
// through its Order one after another, are each what WriteSorted writes,
// whatever names they have in whatever order: the same names as the head
// before, in its places or others, others of the same lengths, more or
// fewer, more than an Order keeps. heads is a list of heads separated by
// "/", each a list of names separated by ",".
func FuzzWriteSortedInMatchesWriteSorted(f *testing.F) {
	for _, s := range []string{
		"X-B,X-A,X-C/X-B,X-A,X-C/X-A,X-B,X-C/X-C,X-B/X-C,X-B,X-A",
		"User-Agent,Content-Type,Accept-Encoding,Fencing-Token,Fencing-Resource/User-Agent,Content-Type,Accept-Encoding,Fencing-Token,Fencing-Resource",
		"A,B/A,C/C,A/B,A,C,D/D,C,B,A/A",
		"Q,P,O,N,M,L,K,J,I,H,G,F,E,D,C,B,A/Q,P,O,N,M,L,K,J,I,H,G,F,E,D,C,B,A/P,O,N,M,L,K,J,I,H,G,F,E,D,C,B,A/P,O,N,M,L,K,J,I,H,G,F,E,D,C,B,A",
		"X-Forwarded-Host,X-Forwarded-For,Host/X-Forwarded-For,X-Forwarded-Host,Host//X-Forwarded-For,X-Forwarded-Host,Host",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, heads string) {
		var o Order
		exclude := []string{"Host", "User-Agent"}
		var want, got bytes.Buffer
		for i, head := range strings.Split(heads, "/") {
			var fs Fields
			for j, name := range strings.Split(head, ",") {
				if name != "" && fs.Index(name) < 0 {
					fs.Add(strings.Clone(name), []string{strconv.Itoa(i) + "." + strconv.Itoa(j)})
				}
			}
			want.Reset()
			got.Reset()
			bw := bufio.NewWriter(&want)
			WriteSorted(bw, slices.Clone(fs), exclude)
			_ = bw.Flush()
			bw.Reset(&got)
			WriteSortedIn(bw, fs, exclude, &o)
			_ = bw.Flush()
			if got.String() != want.String() {
				t.Fatalf("head %d (%q) on the connection wrote\n%q\nWriteSorted\n%q", i+1, head, got.String(), want.String())
			}
		}
	})
}
