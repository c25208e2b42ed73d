package engine

import (
	"bufio"
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// checkWriteHead requires writeHead and the body write to write exactly
// what Request.Write writes for req to host, or to fail where it fails.
func checkWriteHead(t *testing.T, name, host string, req *http.Request, body []byte) {
	t.Helper()
	var want bytes.Buffer
	if err := req.Clone(req.Context()).Write(&want); err != nil {
		// Request.Write refuses it; so must writeHead.
		line, herr := hostLine(host)
		var got bytes.Buffer
		bw := bufio.NewWriter(&got)
		if herr == nil && writeHead(bw, req, wire.FieldsOf(req.Header), line, nil) == nil {
			t.Errorf("case %s: Request.Write fails (%v), writeHead does not", name, err)
		}
		return
	}
	line, err := hostLine(host)
	if err != nil {
		t.Fatalf("case %s: hostLine(%q): %v", name, host, err)
	}
	var got bytes.Buffer
	bw := bufio.NewWriter(&got)
	if err := writeHead(bw, req, wire.FieldsOf(req.Header), line, nil); err != nil {
		t.Fatalf("case %s: writeHead: %v (Request.Write wrote %q)", name, err, want.String())
	}
	_, _ = bw.Write(body)
	_ = bw.Flush()
	if got.String() != want.String() {
		t.Errorf("case %s:\nwriteHead:     %q\nRequest.Write: %q", name, truncate(got.String(), 400), truncate(want.String(), 400))
	}
	// On a connection: the fields in the map's order, the same twice (the
	// second head written in the order the first sorted in), then again
	// in another order.
	var order wire.Order
	var fields wire.Fields
	for k, vv := range req.Header {
		fields = append(fields, wire.Field{Name: k, Values: vv})
	}
	for i := range 3 {
		head := slices.Clone(fields)
		if i == 2 {
			slices.Reverse(head)
		}
		got.Reset()
		bw.Reset(&got)
		if err := writeHead(bw, req, head, line, &order); err != nil {
			t.Fatalf("case %s: writeHead, head %d of a connection: %v", name, i+1, err)
		}
		_, _ = bw.Write(body)
		_ = bw.Flush()
		if got.String() != want.String() {
			t.Errorf("case %s, head %d of a connection:\nwriteHead:     %q\nRequest.Write: %q", name, i+1, truncate(got.String(), 400), truncate(want.String(), 400))
		}
	}
}

// inMemoryBody is a body as the gateway hands a small write's to the
// engine: one the Transport recognises as in memory.
func inMemoryBody(b []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// writeHead and the body write exactly what Request.Write writes, for the
// requests the direct forward carries: fixed odd cases and seeded random
// ones (methods, paths, queries, header names and values with newlines,
// spaces and control bytes, User-Agent absent, empty or set, bodies or none).
func TestWriteHeadMatchesRequestWrite(t *testing.T) {
	hosts := []string{"127.0.0.1:8080", "upstream.internal", "[::1]:9000", "[fe80::1%25eth0]:80", "bücher.example", "bad host/x"}
	methods := []string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "QUERY", ""}
	paths := []string{"", "/", "/a/b", "/a%2Fb", "/sp ace", "/é", "/ctl\x01", "/q"}
	rawPaths := []string{"", "/a%2Fb", "/not/matching"}
	queries := []string{"", "a=1", "a=1&b=%20", "x=\x7f", "=", "a=1;b=2"}
	names := []string{"X-A", "Accept", "Content-Type", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer", "Host", "Bad Name", "X-Forwarded-For", "Fencing-Token", "a"}
	values := []string{"", "v", " padded ", "multi\nline", "cr\rlf", "tab\tin", "\x00nul", "ünï"}
	check := func(i int, host string, req *http.Request, body []byte) {
		t.Helper()
		checkWriteHead(t, strconv.Itoa(i), host, req, body)
	}
	rng := rand.New(rand.NewPCG(13, 5))
	for i := range 3000 {
		host := hosts[rng.IntN(len(hosts))]
		u := &url.URL{Scheme: "http", Host: host, Path: paths[rng.IntN(len(paths))], RawPath: rawPaths[rng.IntN(len(rawPaths))], RawQuery: queries[rng.IntN(len(queries))], ForceQuery: rng.IntN(8) == 0}
		req := &http.Request{Method: methods[rng.IntN(len(methods))], URL: u, Header: http.Header{}}
		for range rng.IntN(6) {
			n := names[rng.IntN(len(names))]
			for range 1 + rng.IntN(2) {
				req.Header[n] = append(req.Header[n], values[rng.IntN(len(values))])
			}
		}
		switch rng.IntN(3) {
		case 0:
			delete(req.Header, "User-Agent")
		case 1:
			req.Header["User-Agent"] = []string{""}
		}
		var body []byte
		if rng.IntN(2) == 0 {
			body = []byte(strings.Repeat("b", 1+rng.IntN(4<<10)))
			req.Body, req.ContentLength = inMemoryBody(body), int64(len(body))
		}
		check(i, host, req, body)
	}
	// Heads whose start (request line, Host, User-Agent, Content-Length)
	// fits the writer's free space, or just does not (writeHead's two
	// ways), with bodies that fill the buffer after it.
	for i, n := range []int{3900, 3990, 4000, 4010, 4020, 4030, 4040, 4050, 4060, 5000, 9000} {
		for _, ua := range []string{"", "w", strings.Repeat("u", 100)} {
			u := &url.URL{Scheme: "http", Host: "h", Path: "/" + strings.Repeat("p", n), RawQuery: "q=1"}
			body := []byte(strings.Repeat("b", 100+i))
			req := &http.Request{Method: "POST", URL: u, Header: http.Header{"User-Agent": {ua}, "X-A": {"1"}},
				Body: inMemoryBody(body), ContentLength: int64(len(body))}
			check(4000+i, "h", req, body)
			req = &http.Request{Method: "POST", URL: u, Header: http.Header{"X-A": {"1"}}}
			check(4000+i, "h", req, nil)
		}
	}
	// An empty User-Agent list, and a path that needs escaping.
	req := &http.Request{Method: "POST", URL: &url.URL{Scheme: "http", Host: "h", Path: "/a b/ü"}, Header: http.Header{"User-Agent": nil, "X": {"1"}}}
	check(-1, "h", req, nil)
}

// FuzzWriteHead: for any request the direct forward can carry (a method,
// a URL with a path, raw path and query, header fields, a body in memory or
// none), writeHead and the body write write what Request.Write writes, or
// fail where it fails. go test -fuzz FuzzWriteHead ./gateway/internal/engine/
func FuzzWriteHead(f *testing.F) {
	f.Add("POST", "127.0.0.1:8080", "/a/b", "", "x=1", false, "X-A", "v", "User-Agent", "worker/1", []byte("body"))
	f.Add("", "[fe80::1%25eth0]:80", "/a%2Fb", "/a%2Fb", "", true, "Content-Length", "5", "Host", "other", []byte{})
	f.Add("PUT", "bücher.example", "/sp ace", "", "a=1;b=2", false, "multi", "line\nbreak", "Transfer-Encoding", "chunked", []byte("x"))
	f.Add("GET", "bad host/x", "/ctl\x01", "/not/matching", "x=\x7f", false, "Trailer", "X-T", "X", " padded ", []byte(nil))
	f.Add("POST", "h", "/"+strings.Repeat("p", 4030), "", "q", true, "User-Agent", strings.Repeat("u", 40), "X", "v", []byte("body")) // a head's start that does not fit
	f.Fuzz(func(t *testing.T, method, host, path, rawPath, query string, forceQuery bool, n1, v1, n2, v2 string, body []byte) {
		if !validMethod(method) {
			return // Request.Write writes any method; the direct forward gets only the ones Go's server parsed
		}
		u := &url.URL{Scheme: "http", Host: host, Path: path, RawPath: rawPath, RawQuery: query, ForceQuery: forceQuery}
		req := &http.Request{Method: method, URL: u, Header: http.Header{}}
		req.Header[n1] = append(req.Header[n1], v1)
		req.Header[n2] = append(req.Header[n2], v2)
		if len(body) > 0 {
			req.Body, req.ContentLength = inMemoryBody(body), int64(len(body))
		}
		checkWriteHead(t, "fuzz", host, req, body)
	})
}

// validMethod: a method Go's server would parse from a request line (a
// token), or "" (GET).
func validMethod(m string) bool {
	for i := 0; i < len(m); i++ {
		if c := m[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// BenchmarkWriteHead: the head of a fenced write as the gateway sends it
// upstream (its fields in the order the gateway builds them: the client's,
// then its own), by writeHead.
func BenchmarkWriteHead(b *testing.B) {
	body := bytes.Repeat([]byte("w"), 200)
	req := &http.Request{Method: "POST", URL: &url.URL{Scheme: "http", Host: "127.0.0.1:8080", Path: "/x"},
		Body: inMemoryBody(body), ContentLength: int64(len(body))}
	host, err := hostLine("127.0.0.1:8080")
	if err != nil {
		b.Fatal(err)
	}
	fields := wire.Fields{
		{Name: "Content-Type", Values: []string{"application/json"}},
		{Name: "User-Agent", Values: []string{"fence-worker/1.4 (+go)"}},
		{Name: "Accept-Encoding", Values: []string{"gzip"}},
		{Name: "Fencing-Token", Values: []string{"184467"}},
		{Name: "Fencing-Resource", Values: []string{"orders:eu-west-1"}},
		{Name: "X-Forwarded-For", Values: []string{"10.1.2.3"}},
		{Name: "X-Forwarded-Host", Values: []string{"api.example.com"}},
		{Name: "X-Forwarded-Proto", Values: []string{"http"}},
		{Name: "Traceparent", Values: []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
	}
	bw := bufio.NewWriterSize(io.Discard, 4<<10)
	sorted := make(wire.Fields, len(fields)) // writeHead may sort the fields in place
	var order wire.Order                     // the connection's
	b.ReportAllocs()
	for b.Loop() {
		copy(sorted, fields)
		if err := writeHead(bw, req, sorted, host, &order); err != nil {
			b.Fatal(err)
		}
		_, _ = bw.Write(body)
		_ = bw.Flush()
	}
}
