package framing

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/textproto"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

type leanCtxKey struct{}

// leanTemplate is what the loop makes of a connection for the lean parse.
func leanTemplate() *http.Request {
	ctx := context.WithValue(context.Background(), leanCtxKey{}, "conn")
	return (&http.Request{RemoteAddr: "192.0.2.7:4711"}).WithContext(ctx)
}

// goReads is what Go's server makes of a whole head: http.ReadRequest and
// the checks it adds (checkRequest), or an error.
func goReads(head []byte) (*http.Request, error) {
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err == nil {
		err = checkRequest(req)
	}
	return req, err
}

// sameRequest says how lean differs from std, Go's parse of the same head
// ("" if it does not), in every field a handler can see.
func sameRequest(lean, std *http.Request, template *http.Request) string {
	switch {
	case lean.Method != std.Method:
		return "Method " + lean.Method + " against " + std.Method
	case !reflect.DeepEqual(lean.URL, std.URL):
		return "URL " + lean.URL.String() + " against " + std.URL.String()
	case lean.Proto != std.Proto || lean.ProtoMajor != std.ProtoMajor || lean.ProtoMinor != std.ProtoMinor:
		return "Proto " + lean.Proto + " against " + std.Proto
	case !reflect.DeepEqual(lean.Header, std.Header):
		return "Header"
	case lean.ContentLength != std.ContentLength:
		return "ContentLength"
	case lean.Close != std.Close:
		return "Close"
	case lean.Host != std.Host:
		return "Host " + lean.Host + " against " + std.Host
	case lean.RequestURI != std.RequestURI:
		return "RequestURI"
	case !reflect.DeepEqual(lean.TransferEncoding, std.TransferEncoding):
		return "TransferEncoding"
	case !reflect.DeepEqual(lean.Trailer, std.Trailer):
		return "Trailer"
	case std.ContentLength == 0 && (lean.Body != http.NoBody || std.Body != http.NoBody):
		return "Body of an empty request"
	case lean.Form != nil || lean.PostForm != nil || lean.MultipartForm != nil || lean.TLS != nil || lean.Response != nil:
		return "a field Go's parser leaves unset"
	case lean.RemoteAddr != template.RemoteAddr || lean.Context() != template.Context():
		return "the connection's remote address or context"
	}
	return ""
}

// leanSeeds are heads of every kind the lean parse must take as Go does,
// or leave to Go: what clients send, and the edges of each rule.
var leanSeeds = []string{
	"POST /v1/proxy/svc/lines HTTP/1.1\r\nHost: gw\r\nFencing-Lease: abc.def-123\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n",
	"POST /v1/proxy/svc/lines HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 256\r\nFencing-Lease: l_1\r\nAccept-Encoding: gzip\r\n\r\n",
	"PUT /v1/proxy/a/b?x=1&y=%zz HTTP/1.1\r\nhost: gw\r\ncontent-length: 007\r\nconnection: keep-alive, Close\r\n\r\n",
	"DELETE /v1/proxy/a? HTTP/1.1\r\nHost: gw\r\nX-A: 1\r\nx-a: 2\r\nX-A:3\r\n\r\n",
	"GET /v1/proxy/a?? HTTP/1.1\r\nHost: gw\r\nX-Empty:\r\nX-Space: \t v \t \r\n\r\n",
	"PATCH /v1/proxy/a;b,c=d@e:f$g&h+i~j HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n",
	"POST /v1/proxy/a%20b HTTP/1.1\r\nHost: gw\r\n\r\n",
	"POST /v1/proxy/a!b HTTP/1.1\r\nHost: gw\r\n\r\n",
	"POST /v1/proxy/a#b HTTP/1.1\r\nHost: gw\r\n\r\n",
	"POST /v1/proxy/a?q#f HTTP/1.1\r\nHost: gw\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nContent-Length: +5\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nContent-Length: 1234567890123456789\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nContent-Length:\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nHost: gw\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: g w\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nX-A: 1\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost : gw\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX_Under_Score: 1\r\nx-lower-case: 2\r\nX-\xff: 3\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-Obs: caf\xc3\xa9\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-Nul: a\x00b\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-Cr: a\rb\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nPragma: no-cache\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nTrailer: X-T\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\n folded\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\n: empty name\r\nHost: gw\r\n\r\n",
	"POST /v1/proxy/a  HTTP/1.1\r\nHost: gw\r\n\r\n",
	"POST  /v1/proxy/a HTTP/1.1\r\nHost: gw\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.0\r\nHost: gw\r\n\r\n",
	"P\x00ST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\n\r\n",
	"POST http://gw/v1/proxy/a HTTP/1.1\r\nHost: gw\r\n\r\n",
	"POST //v1/proxy/a HTTP/1.1\r\nHost: gw\r\n\r\n",
	"POST * HTTP/1.1\r\nHost: gw\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\n\r\n",
	// Connection close in a second line; a value refused, or with a tab,
	// at each place of an eight-byte block; more fields than the parse
	// keeps line ends and names for, with names repeated on both sides.
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-V: 0123456789abcdef\tghijklmnop\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-V: 0123456789abcde\x7fghijklmnop\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-V: 0123456789abcdefg\x1fhijklmnop\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-V: 01234567\x80abcdefghijklmnop\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-V: 0123456789abcdef ghijklmnopqrstu\xff\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\n" + strings.Repeat("X-A: 1\r\nX-B: 2\r\n", 6) +
		"X-C: 3\r\nX-D: 4\r\nX-E: 5\r\nX-F: 6\r\nX-G: 7\r\nX-A: 8\r\nX-H: 9\r\nX-C: 10\r\nContent-Length: 0\r\nX-H: 11\r\n\r\n",
	// The one-pass field parse: a colon at each place of an eight-byte
	// block, a known name in another case or with more after it, names
	// whose lengths differ by 64 (one bit of the parse's length set),
	// digits in a name, a line with no colon (the search for one runs
	// into the next line), values of only spaces and tabs, a tab before
	// the CR, a CR alone in a value.
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nAbcdefg: 1\r\nAbcdefgh: 2\r\nAbcdefghi:3\r\nAbcdefghijklmno:\r\nAbcdefghijklmnop: 5\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHOST: gw\r\ncontent-TYPE: a/b\r\nHost-X: 1\r\nContent-Types: 2\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-Y: 1\r\n" + strings.Repeat("Y", 67) + ": 2\r\nx-y: 3\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-B3-Sampled: 1\r\n0: 2\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-No-Colon\r\nX-A: 1\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-A:    \r\nX-B:\t\r\nX-C: \t \t\r\nX-D: v\t\r\nContent-Length: 3 \r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-A: 0123456\r\r\nX-B: 1\r\n\r\n",
	"POST /v1/proxy/a HTTP/1.1\r\nHost:gw\r\nFencing-Lease:01JD6Y0S6Z7W3K8N9P2Q4R5T6V\r\nAccept-Encoding:gzip\r\n\r\n",
}

// TestKnownNamesAreCanonical: a name knownName gives as a constant is
// taken with no check of its bytes, as its own canonical key: each must
// be a token name, canonical, and given as it is.
func TestKnownNamesAreCanonical(t *testing.T) {
	for _, n := range []string{"Host", "User-Agent", "Content-Length", "Content-Type", "Accept-Encoding", "Accept",
		"Authorization", "Fencing-Lease", "Fencing-Token", "Idempotency-Key", "Traceparent", "Tracestate"} {
		if got := knownName([]byte(n)); got != n || textproto.CanonicalMIMEHeaderKey(n) != n || !httpguts.ValidHeaderFieldName(n) {
			t.Errorf("knownName(%q) = %q", n, got)
		}
		if got := knownName([]byte(strings.ToLower(n))); got != "" {
			t.Errorf("knownName(%q) = %q, want it left to wire.CanonicalKey", strings.ToLower(n), got)
		}
	}
}

// FuzzLeanHeadMatchesReadRequest holds the lean parse to Go's: a head it
// takes, Go's server takes too, and parses into the same request.
func FuzzLeanHeadMatchesReadRequest(f *testing.F) {
	for _, s := range leanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, head []byte) {
		end := wire.HeadEnd(head)
		if end <= 0 {
			return // mine takes only a whole head of CRLF lines
		}
		head = head[:end]
		template := leanTemplate()
		before := string(head)
		into := new(leanRequest)
		lean, ok := parseLean(head, template, into)
		if string(head) != before {
			t.Fatalf("the lean parse wrote into the buffer: %q", head)
		}
		std, err := goReads(head)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("the lean parse took a head Go's server refuses (%v): %q", err, head)
		}
		if diff := sameRequest(lean, std, template); diff != "" {
			t.Fatalf("the lean parse differs from Go's in %s: %q", diff, head)
		}
		if diff := listedDiff(into, head); diff != "" {
			t.Fatalf("the lean parse's list of fields differs from its header in %s: %q", diff, head)
		}
	})
}

// TestLeanHeadSeeds runs every seed and says which the lean parse takes:
// the heads clients send must be taken, or the loop pays for
// http.ReadRequest on every write.
func TestLeanHeadSeeds(t *testing.T) {
	mustTake := map[int]bool{0: true, 1: true, 2: true, 3: true, 4: true, 5: true, 24: true, 37: true, 38: true, 43: true,
		44: true, 45: true, 46: true, 47: true, 49: true, 51: true}
	for i, s := range leanSeeds {
		template := leanTemplate()
		into := new(leanRequest)
		lean, ok := parseLean([]byte(s), template, into)
		std, err := goReads([]byte(s))
		switch {
		case ok && err != nil:
			t.Errorf("seed %d: taken, but Go's server refuses it (%v): %q", i, err, s)
		case ok:
			if diff := sameRequest(lean, std, template); diff != "" {
				t.Errorf("seed %d: differs from Go's parse in %s: %q", i, diff, s)
			}
			if diff := listedDiff(into, []byte(s)); diff != "" {
				t.Errorf("seed %d: its list of fields differs from its header in %s: %q", i, diff, s)
			}
		case mustTake[i]:
			t.Errorf("seed %d: a plain head left to http.ReadRequest: %q", i, s)
		}
	}
}

// TestLeanHeadTakesWhatClientsSend: the heads Go's client writes for a
// fenced write (the Go SDK's, fencegw-load's) take the lean road.
func TestLeanHeadTakesWhatClientsSend(t *testing.T) {
	for _, target := range []string{"/v1/proxy/svc/lines", "/v1/proxy/stock/item-42?warehouse=b&x=1"} {
		req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:8080"+target, strings.NewReader(strings.Repeat("x", 256)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Fencing-Lease", "lease_01JD6Y0S6Z7W3K8N9P2Q4R5T6V")
		req.Header.Set("Fencing-Token", "42")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k-1")
		var buf bytes.Buffer
		if err := req.Write(&buf); err != nil {
			t.Fatal(err)
		}
		head := buf.Bytes()[:bytes.Index(buf.Bytes(), []byte("\r\n\r\n"))+4]
		template := leanTemplate()
		lean, ok := parseLean(head, template, new(leanRequest))
		if !ok {
			t.Fatalf("Go's client's head left to http.ReadRequest: %q", head)
		}
		std, err := goReads(head)
		if err != nil {
			t.Fatal(err)
		}
		if diff := sameRequest(lean, std, template); diff != "" {
			t.Fatalf("differs from Go's parse in %s: %q", diff, head)
		}
	}
}

// TestLeanHeadAllocations: the lean parse of a fenced write's head
// allocates the head's string and nothing else once its connection's
// storage is made (the request with its URL, the header map and its
// values), and nothing per field.
func TestLeanHeadAllocations(t *testing.T) {
	head := []byte(leanSeeds[1])
	template := leanTemplate()
	var store leanRequest
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := parseLean(head, template, &store); !ok {
			t.Fatal("not taken")
		}
	})
	if allocs > 1 {
		t.Fatalf("%v allocations per head on a connection, want 1 (the head's string)", allocs)
	}
}

// TestLeanHeadReusesNothingItShows: a request parsed into a connection's
// storage holds the fields of its own head, none of the last one's, when
// the two differ in names, values and counts, in either order, after a
// head declined half way, and after a handler set a field in the last
// request's map.
func TestLeanHeadReusesNothingItShows(t *testing.T) {
	template := leanTemplate()
	var store leanRequest
	declined := "POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nX-Partial: 1\r\nUser-Agent: x\r\nExpect: 100-continue\r\n\r\n"
	heads := []string{leanSeeds[1], leanSeeds[3], leanSeeds[43], leanSeeds[0], leanSeeds[3], leanSeeds[1],
		declined, leanSeeds[1], leanSeeds[1], leanSeeds[44], declined, leanSeeds[0]}
	for i, s := range heads {
		lean, ok := parseLean([]byte(s), template, &store)
		if s == declined {
			if ok {
				t.Fatalf("head %d taken: %q", i, s)
			}
			continue
		}
		if !ok {
			t.Fatalf("head %d not taken: %q", i, s)
		}
		std, err := goReads([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		if diff := sameRequest(lean, std, template); diff != "" {
			t.Fatalf("head %d, parsed after %d others into one storage, differs from Go's parse in %s: %q", i, i, diff, s)
		}
		if diff := listedDiff(&store, []byte(s)); diff != "" {
			t.Fatalf("head %d, parsed after %d others into one storage: its list of fields differs from its header in %s: %q", i, i, diff, s)
		}
		lean.Header.Set("X-Handler", "set") // as a handler may
	}
}

// listedDiff says how the fields the lean parse listed (leanRequest.fields)
// differ from its request's header, "" if they do not: each of the
// header's names once, in the order the head's lines first name them, with
// the map's own values. They must be listed whenever the head's names fit.
func listedDiff(lr *leanRequest, head []byte) string {
	h := lr.req.Header
	if !lr.complete {
		if len(h) <= len(lr.fields) {
			return fmt.Sprintf("completeness: %d names fit, not listed", len(h))
		}
		return ""
	}
	fs := lr.fields[:lr.listed]
	if len(fs) != len(h) {
		return fmt.Sprintf("count: %d listed, %d in the header", len(fs), len(h))
	}
	var order []string
	for _, line := range strings.Split(string(head), "\r\n")[1:] {
		name, _, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		k := textproto.CanonicalMIMEHeaderKey(name)
		if k != "Host" && !slices.Contains(order, k) {
			order = append(order, k)
		}
	}
	for i, f := range fs {
		if i >= len(order) || f.Name != order[i] {
			return fmt.Sprintf("order: %q listed %d, the head names %q", f.Name, i, order)
		}
		vv := h[f.Name]
		if !slices.Equal(f.Values, vv) || len(vv) > 0 && &f.Values[0] != &vv[0] {
			return fmt.Sprintf("values of %s: %q listed, %q in the map (or another array)", f.Name, f.Values, vv)
		}
	}
	return ""
}

// clientWriteHead is the head Go's client sends for a fenced write (the
// fields in the order its Request.Write writes them).
const clientWriteHead = "POST /proxy/svc/orders/item-42 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n" +
	"User-Agent: Go-http-client/1.1\r\nContent-Length: 200\r\nContent-Type: application/json\r\n" +
	"Fencing-Lease: 01JD6Y0S6Z7W3K8N9P2Q4R5T6V\r\nAccept-Encoding: gzip\r\n\r\n"

func BenchmarkHeadParse(b *testing.B) {
	head := []byte(leanSeeds[1])
	template := leanTemplate()
	b.Run("lean", func(b *testing.B) {
		b.ReportAllocs()
		var store leanRequest
		for b.Loop() {
			_, _ = parseLean(head, template, &store)
		}
	})
	b.Run("client", func(b *testing.B) {
		// A fenced write's head from Go's client: the head the
		// gateway's profile is of.
		head := []byte(clientWriteHead)
		b.ReportAllocs()
		var store leanRequest
		if _, ok := parseLean(head, template, &store); !ok {
			b.Fatal("not taken")
		}
		for b.Loop() {
			_, _ = parseLean(head, template, &store)
		}
	})
	b.Run("ReadRequest", func(b *testing.B) {
		b.ReportAllocs()
		br := bufio.NewReader(nil)
		rd := bytes.NewReader(nil)
		for b.Loop() {
			rd.Reset(head)
			br.Reset(rd)
			req, err := http.ReadRequest(br)
			if err != nil {
				b.Fatal(err)
			}
			_ = checkRequest(req)
			_ = req.WithContext(template.Context())
		}
	})
}
