package engine

import (
	"bufio"
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

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
		var want bytes.Buffer
		if err := req.Clone(req.Context()).Write(&want); err != nil {
			// Request.Write refuses it; so must writeHead.
			line, herr := hostLine(host)
			var got bytes.Buffer
			bw := bufio.NewWriter(&got)
			if herr == nil && writeHead(bw, req, line) == nil {
				t.Errorf("case %d: Request.Write fails (%v), writeHead does not", i, err)
			}
			return
		}
		line, err := hostLine(host)
		if err != nil {
			t.Fatalf("case %d: hostLine(%q): %v", i, host, err)
		}
		var got bytes.Buffer
		bw := bufio.NewWriter(&got)
		if err := writeHead(bw, req, line); err != nil {
			t.Fatalf("case %d: writeHead: %v (Request.Write wrote %q)", i, err, want.String())
		}
		_, _ = bw.Write(body)
		_ = bw.Flush()
		if got.String() != want.String() {
			t.Errorf("case %d:\nwriteHead:     %q\nRequest.Write: %q", i, truncate(got.String(), 400), truncate(want.String(), 400))
		}
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
	// An empty User-Agent list, and a path that needs escaping.
	req := &http.Request{Method: "POST", URL: &url.URL{Scheme: "http", Host: "h", Path: "/a b/ü"}, Header: http.Header{"User-Agent": nil, "X": {"1"}}}
	check(-1, "h", req, nil)
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
