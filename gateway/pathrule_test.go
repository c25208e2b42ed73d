package gateway

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/fencegw/fencegw/tokens"
)

func TestCheckProxyPath(t *testing.T) {
	for _, tc := range []struct {
		raw    string
		want   string // decoded path; "" if refused
		detail string // part of the refusal's detail
	}{
		{"/", "/", ""},
		{"/a/b", "/a/b", ""},
		{"/a;jsessionid=1/b", "/a;jsessionid=1/b", ""},
		{"/a%2Fb", "/a/b", ""},
		{"/a%20b/c", "/a b/c", ""},
		{"/caf%C3%A9", "/café", ""},
		{"/x..y/.z/z./a...b", "/x..y/.z/z./a...b", ""},
		{"/ /a", "/ /a", ""},
		{"/a/../b", "", "dot segments"},
		{"/a/./b", "", "dot segments"},
		{"/..", "", "dot segments"},
		{"/%2e%2e/x", "", "dot segments"},
		{"/%2E./x", "", "dot segments"},
		{"/base/..;/escape", "", "dot segments"},
		{"/..;jsessionid=x/y", "", "dot segments"},
		{"/.;/y", "", "dot segments"},
		{"/a/%2e%2e%3b/y", "", "dot segments"},
		{"/.../x", "", "dot segments"},
		{"/. ./x", "", "dot segments"},
		{"/.. /x", "", "dot segments"},
		{"/..%2fx", "", "dot segments"},
		{"/..%5cx", "", "backslash"},
		{"/a\\b", "", "backslash"},
		{"/%5c", "", "backslash"},
		{"/%252e%252e/x", "", "encoded percent"},
		{"/%25", "", "encoded percent"},
		{"/%c0%ae%c0%ae/x", "", "UTF-8"},
		{"/%e0%80%ae", "", "UTF-8"},
		{"/%ff", "", "UTF-8"},
		{"/.%e2%80%80/x", "", "dot segments"}, // '.' U+2000, NFKC ". "
		{"/%c2%a0..%e3%80%80;x/y", "", "dot segments"},
		{"/a.%c2%a0b", "/a. b", ""},
		{"/%ef%bc%8e%ef%bc%8e/x", "", "NFKC"}, // U+FF0E U+FF0E
		{"/\u2025/x", "", "NFKC"},
		{"/a\uFF0Fb", "", "NFKC"},
		{"/%00", "", "control"},
		{"/a%0d%0ab", "", "control"},
		{"/a%7f", "", "control"},
		{"/a%09b", "", "control"},
		{"/%zz", "", "percent-encoded"},
	} {
		got, err := checkProxyPath(tc.raw)
		if tc.want != "" {
			if err != nil || got != tc.want {
				t.Errorf("checkProxyPath(%q) = %q, %v; want %q", tc.raw, got, err, tc.want)
			}
			continue
		}
		p, _ := problemFor(err)
		if err == nil || p.Status != http.StatusBadRequest || p.Field != "path" || !strings.Contains(p.Detail, tc.detail) {
			t.Errorf("checkProxyPath(%q) = %q, %+v; want a 400 naming the path and %q", tc.raw, got, p, tc.detail)
		}
	}
}

// The common path costs no allocation.
func TestCheckProxyPathAllocs(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _, _ = checkProxyPath("/accounts/88213/lines;v=2") }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// nfkcUnsafe is exactly the set of characters whose NFKC form holds one of
// the characters the rule is about.
func TestNFKCUnsafeIsComplete(t *testing.T) {
	for r := rune(0); r <= utf8.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		want := r >= utf8.RuneSelf && strings.ContainsAny(norm.NFKC.String(string(r)), `./\;%`)
		if nfkcUnsafe(r) != want {
			t.Errorf("nfkcUnsafe(%U) = %v, NFKC %q", r, !want, norm.NFKC.String(string(r)))
		}
	}
}

func TestNFKCSpaceIsComplete(t *testing.T) {
	for r := rune(utf8.RuneSelf); r <= utf8.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		n := norm.NFKC.String(string(r))
		if want := n != "" && strings.Trim(n, " ") == ""; nfkcSpace(r) != want {
			t.Errorf("nfkcSpace(%U) = %v, NFKC %q", r, !want, n)
		}
	}
}

// upstreamReadings are ways upstreams are known to read a path: as is,
// decoded again, NFKC-normalised, with '\' for '/', with ";parameters"
// dropped from each segment, and with trailing dots and spaces trimmed
// (Windows), in combination.
func upstreamReadings(p string) []string {
	again, err := url.PathUnescape(p)
	if err != nil {
		again = p
	}
	var out []string
	for _, s := range []string{p, again, norm.NFKC.String(p), norm.NFKC.String(again)} {
		s = strings.ReplaceAll(s, `\`, "/")
		segs := strings.Split(s, "/")
		for i, seg := range segs {
			if j := strings.IndexByte(seg, ';'); j >= 0 {
				seg = seg[:j]
			}
			segs[i] = seg
		}
		out = append(out, s, strings.Join(segs, "/"))
		for i, seg := range segs {
			if t := strings.TrimRight(seg, ". "); t == "" && strings.Contains(seg, ".") {
				segs[i] = ".." // what Windows makes of a segment of dots and spaces: at worst a step up
			}
		}
		out = append(out, strings.Join(segs, "/"))
	}
	return out
}

// A path the rule lets through reads the same, without dot segments, to
// every upstream reading above.
func FuzzCheckProxyPath(f *testing.F) {
	for _, s := range []string{"/a/b", "/a/../b", "/%2e%2e/x", "/a%2Fb", "/%00", "/./", "/", "/..;/x", "/%252e%252e",
		"/%c0%ae", "/..%5c", "/a\\b", "/\uff0e\uff0e/x", "/%e2%80%a5", "/a;b/c;d", "/. ./", ".%e2%80%80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		path, err := checkProxyPath(raw)
		if err != nil {
			return
		}
		if !utf8.ValidString(path) || strings.ContainsAny(path, "%\\\x00\r\n") {
			t.Fatalf("checkProxyPath(%q) = %q", raw, path)
		}
		for _, reading := range upstreamReadings(path) {
			for seg := range strings.SplitSeq(reading, "/") {
				if seg == "." || seg == ".." {
					t.Fatalf("checkProxyPath(%q) = %q, which an upstream may read as %q", raw, path, reading)
				}
			}
		}
	})
}

// Upgrades and CONNECT on /v1/proxy/ are refused with a problem naming
// them, before the lease is looked at, and nothing reaches the upstream
// (which would answer 101 and relay bytes both ways for as long as the
// connection lasts, past the lease's end). The connection stays HTTP.
func TestProxyRefusesTunnels(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, false)
	lease := tg.lease(t, "r")
	head := "GET /v1/proxy/svc/ws HTTP/1.1\r\nHost: gw\r\nFencing-Lease: " + lease + "\r\n"
	for name, tc := range map[string]struct {
		raw    string
		status int
		field  string
	}{
		"websocket":            {head + "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", 400, "Upgrade"},
		"echo":                 {head + "Connection: keep-alive, upgrade\r\nUpgrade: echo\r\n\r\n", 400, "Upgrade"},
		"upgrade without conn": {head + "Upgrade: echo\r\n\r\n", 400, "Upgrade"},
		"connection upgrade":   {head + "Connection: Upgrade\r\n\r\n", 400, "Upgrade"},
		"h2c":                  {head + "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n", 400, "Upgrade"},
		"connect":              {"CONNECT /v1/proxy/svc/x HTTP/1.1\r\nHost: gw\r\nFencing-Lease: " + lease + "\r\n\r\n", 405, "method"},
	} {
		t.Run(name, func(t *testing.T) {
			c := tg.dial(t)
			_, _ = io.WriteString(c, tc.raw+"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
			answers, bodies, _ := readAnswers(t, c)
			if len(answers) != 2 || answers[0].StatusCode != tc.status || answers[0].Header.Get("Content-Type") != problemContentType {
				t.Fatalf("%d answers %q; want %d then the probe's 200", len(answers), bodies, tc.status)
			}
			var p problem
			if err := json.Unmarshal([]byte(bodies[0]), &p); err != nil || p.Field != tc.field || !strings.Contains(p.Detail, "one request and one answer") {
				t.Fatalf("problem %s", bodies[0])
			}
			if answers[1].StatusCode != 200 {
				t.Fatalf("the connection is not HTTP any more: %d %q", answers[1].StatusCode, bodies[1])
			}
		})
	}
	if got := up.seen(); len(got) != 0 {
		t.Fatalf("upstream got %+v", got)
	}
}

// Ambiguous paths and lease headers, sent raw as an attacker would: 400
// naming the field, nothing forwarded.
func TestProxyRefusesAmbiguousRequests(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, false)
	lease := tg.lease(t, "r")
	for _, tc := range []struct{ target, extra, field string }{
		{"/v1/proxy/svc/base/..;/escape", "", "path"},
		{"/v1/proxy/svc/base/..%5cescape", "", "path"},
		{"/v1/proxy/svc/base/..\\escape", "", "path"},
		{"/v1/proxy/svc/base/%252e%252e/escape", "", "path"},
		{"/v1/proxy/svc/base/%c0%ae%c0%ae/escape", "", "path"},
		{"/v1/proxy/svc/base/%2e%2e/escape", "", "path"},
		{"/v1/proxy/svc/base/%ef%bc%8e%ef%bc%8e/escape", "", "path"},
		{"/v1/proxy/svc/x", "Fencing-Lease: " + lease + "\r\n", HeaderLease},
		{"/v1/proxy/svc/x", "Fencing-Lease: fl_other\r\n", HeaderLease},
	} {
		c := tg.dial(t)
		_, _ = io.WriteString(c, "POST "+tc.target+" HTTP/1.1\r\nHost: gw\r\nFencing-Lease: "+lease+"\r\n"+tc.extra+"Content-Length: 1\r\n\r\nx")
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.target, err)
		}
		b, _ := io.ReadAll(resp.Body)
		var p problem
		if resp.StatusCode != 400 || json.Unmarshal(b, &p) != nil || p.Code != tokens.CodeInvalidRequest || p.Field != tc.field {
			t.Errorf("%s %q: %d %s; want 400 invalid_request naming %s", tc.target, tc.extra, resp.StatusCode, b, tc.field)
		}
	}
	if got := up.seen(); len(got) != 0 {
		t.Fatalf("upstream got %+v", got)
	}
}

// A client's malformed chunked body is its fault: 400 invalid_request
// naming the body, not 502 upstream_unreachable. A fault among the bytes
// read with the head is refused before anything is forwarded (the framing
// scanner follows the chunks); one further on is found once the head had
// left for the upstream, so the resource drains, and the answer says so.
func TestBrokenChunkedBodyIsTheClientsFault(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, false)
	for i, tc := range []struct {
		body    string
		forward bool // the head leaves before the fault is read
	}{
		{"5\r\nhello\r\nzz\r\nxx\r\n0\r\n\r\n", false}, // a chunk size that is not hex
		{"5\r\nhello\r\n3\nabc\r\n0\r\n\r\n", false},   // a chunk line ending in a bare LF
		{"1388\r\n" + strings.Repeat("x", 5000) + "\r\n3\nabc\r\n0\r\n\r\n", true},
	} {
		res := "broken" + strconv.Itoa(i)
		lease := tg.lease(t, res)
		resp, p, raw := tg.rawAnswer(t, "POST /v1/proxy/svc/chunks HTTP/1.1\r\nHost: gw\r\nFencing-Lease: "+lease+
			"\r\nTransfer-Encoding: chunked\r\n\r\n"+tc.body)
		if resp.StatusCode != http.StatusBadRequest || p.Code != tokens.CodeInvalidRequest || p.Field != "body" {
			t.Fatalf("%.40q: %d %s; want 400 invalid_request naming the body", tc.body, resp.StatusCode, raw)
		}
		if tc.forward && p.Resource != res {
			t.Fatalf("%.40q: the problem names resource %q, want %q", tc.body, p.Resource, res)
		}
		if err := tg.svc.WaitDrains(t.Context()); err != nil { // recorded in the background
			t.Fatal(err)
		}
		st, err := tg.svc.Resource(t.Context(), res)
		if err != nil {
			t.Fatal(err)
		}
		draining := st.DrainUntil.After(time.Now())
		if draining != strings.Contains(p.Detail, "closed to grants for the drain period") || draining != tc.forward {
			t.Fatalf("%.40q: draining %v, but the answer says %q", tc.body, draining, p.Detail)
		}
		if !tc.forward && !strings.Contains(p.Detail, "nothing was forwarded") {
			t.Fatalf("%.40q: %q does not say nothing was forwarded", tc.body, p.Detail)
		}
		t.Logf("%s", p.Detail)
	}
	rec := httptest.NewRecorder()
	tg.g.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `fencegw_writes_total{outcome="bad_request"} 3`) ||
		!strings.Contains(rec.Body.String(), `fencegw_writes_total{outcome="upstream_error"} 0`) {
		t.Fatalf("metrics:\n%s", rec.Body.String())
	}
}

func BenchmarkCheckProxyPath(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := checkProxyPath("/accounts/88213/lines;v=2"); err != nil {
			b.Fatal(err)
		}
	}
}
