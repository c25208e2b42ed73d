package gateway

// What a fenced write's forward must not change, on every road a body
// takes (in memory through the engine, streamed chunked or with Expect
// through http.Transport): the content codings asked for and answered,
// and the request's trailer fields.

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// headSink is an upstream that records each request's header and trailer
// and answers with a fixed gzip body, Content-Encoding: gzip, whatever the
// request asked for (an upstream may; the client is the one to unzip it).
type headSink struct {
	*httptest.Server
	mu      sync.Mutex
	header  []http.Header
	trailer []http.Header
}

func newHeadSink(t *testing.T, answer []byte) *headSink {
	t.Helper()
	s := &headSink{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.header = append(s.header, r.Header.Clone())
		s.trailer = append(s.trailer, r.Trailer.Clone())
		s.mu.Unlock()
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		_, _ = w.Write(answer)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *headSink) take() (header, trailer []http.Header) {
	s.mu.Lock()
	defer s.mu.Unlock()
	header, trailer, s.header, s.trailer = s.header, s.trailer, nil, nil
	return header, trailer
}

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = io.WriteString(zw, s)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// final drops the 1xx answers (100 Continue) of an exchange.
func final(answers []*http.Response, bodies []string, _ bool) ([]*http.Response, []string) {
	var a []*http.Response
	var b []string
	for i, r := range answers {
		if r.StatusCode >= 200 {
			a, b = append(a, r), append(b, bodies[i])
		}
	}
	return a, b
}

// bodyRoads are the ways a fenced write's body reaches the upstream, as
// the rest of a request after its head's Fencing-Lease line.
var bodyRoads = map[string]string{
	"no body":   "Content-Length: 0\r\nConnection: close\r\n\r\n",
	"in memory": "Content-Length: 3\r\nConnection: close\r\n\r\nabc",
	"chunked":   "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
	"expect":    "Expect: 100-continue\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
}

// The gateway asks for no content coding the client did not ask for, and
// hands the upstream's answer on as it came: a gzip answer stays gzip,
// byte for byte, with its Content-Encoding and Content-Length, whether
// the client asked for it or not (http.Transport, left to itself, asks
// for gzip on the client's behalf and unzips the answer).
func TestProxyPassesCompressionThrough(t *testing.T) {
	answer := gzipped(t, strings.Repeat("the upstream's own bytes ", 40))
	up := newHeadSink(t, answer)
	tg := startFraming(t, up.URL, Config{}, false)
	n := 0
	for road, rest := range bodyRoads {
		for _, ae := range []string{"", "gzip", "br, gzip;q=0.5"} {
			n++
			t.Run(road+"/"+ae, func(t *testing.T) {
				lease := tg.lease(t, "gz-"+strconv.Itoa(n))
				head := "POST /v1/proxy/svc/gz HTTP/1.1\r\nHost: gw\r\nFencing-Lease: " + lease + "\r\n"
				if ae != "" {
					head += "Accept-Encoding: " + ae + "\r\n"
				}
				answers, bodies := final(tg.exchange(t, head+rest))
				if len(answers) != 1 || answers[0].StatusCode != http.StatusOK {
					t.Fatalf("answers %v %q, want one 200", answers, bodies)
				}
				resp := answers[0]
				if bodies[0] != string(answer) || resp.Header.Get("Content-Encoding") != "gzip" ||
					resp.Header.Get("Content-Length") != strconv.Itoa(len(answer)) {
					t.Errorf("the client got Content-Encoding %q, Content-Length %q and %d bytes (equal: %v); want the upstream's gzip answer, %d bytes, as it was",
						resp.Header.Get("Content-Encoding"), resp.Header.Get("Content-Length"), len(bodies[0]), bodies[0] == string(answer), len(answer))
				}
				header, _ := up.take()
				if len(header) != 1 {
					t.Fatalf("the upstream got %d requests", len(header))
				}
				got := header[0]["Accept-Encoding"]
				if ae == "" && got != nil || ae != "" && (len(got) != 1 || got[0] != ae) {
					t.Errorf("the upstream got Accept-Encoding %q, the client sent %q", got, ae)
				}
			})
		}
	}
}

// A chunked write's trailer fields reach the upstream, announced or not
// (an announced field that never came stays announced, as Go's server
// records it),
// on both streamed roads, held to the header's rules: nothing the gateway
// drops or sets in the header (Fencing-*, forwarding facts, the upstream's
// configured header), no hop-by-hop or framing field, no field named in
// Connection and no invalid name goes on.
func TestProxyForwardsRequestTrailers(t *testing.T) {
	up := newHeadSink(t, gzipped(t, "ok"))
	tg := startFraming(t, up.URL, Config{UpstreamHeaders: map[string]http.Header{"svc": {"X-Upstream-Key": {"the gateway's"}}}}, false)
	forbidden := "Fencing-Token: 99\r\nFencing-Resource: other\r\nFencing-Lease: x\r\nX-Forwarded-For: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\n" +
		"X-Real-Ip: 6.6.6.6\r\nX-Upstream-Key: forged\r\nTe: trailers\r\nConnection: close\r\nKeep-Alive: 1\r\nUpgrade: x\r\n" +
		"Transfer-Encoding: chunked\r\nContent-Length: 5\r\nHost: evil\r\nProxy-Connection: x\r\nX-Named: 1\r\nX Y: 1\r\n"
	for i, tc := range []struct {
		name, head, trailer string
		want                http.Header
	}{
		{"unannounced", "", "X-T: 1\r\n", http.Header{"X-T": {"1"}}},
		{"announced", "Trailer: X-A, X-B\r\n", "X-A: a\r\nX-A: b\r\n", http.Header{"X-A": {"a", "b"}, "X-B": nil}},
		{"none", "Trailer: X-A\r\n", "", http.Header{"X-A": nil}},
		{"forbidden", "Trailer: Fencing-Token, X-Ok\r\nConnection: X-Named\r\n", forbidden + "X-Ok: ok\r\n", http.Header{"X-Ok": {"ok"}}},
		{"expect", "Expect: 100-continue\r\nConnection: X-Named\r\n", forbidden + "X-Ok: ok\r\n", http.Header{"X-Ok": {"ok"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lease := tg.lease(t, "trailer-"+strconv.Itoa(i))
			answers, bodies := final(tg.exchange(t, "POST /v1/proxy/svc/t HTTP/1.1\r\nHost: gw\r\nFencing-Lease: "+lease+"\r\n"+tc.head+
				"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n"+tc.trailer+"\r\n"))
			if len(answers) != 1 || answers[0].StatusCode != http.StatusOK {
				t.Fatalf("answers %v %q, want one 200", answers, bodies)
			}
			header, trailer := up.take()
			if len(trailer) != 1 {
				t.Fatalf("the upstream got %d requests", len(trailer))
			}
			if !headersEqual(trailer[0], tc.want) {
				t.Errorf("the upstream got the trailer %q, want %q", trailer[0], tc.want)
			}
			if tok := header[0].Values(HeaderToken); len(tok) != 1 || tok[0] == "99" {
				t.Errorf("the upstream got Fencing-Token %q", tok)
			}
			if v := header[0].Values("X-Upstream-Key"); len(v) != 1 || v[0] != "the gateway's" {
				t.Errorf("the upstream got X-Upstream-Key %q", v)
			}
		})
	}
}

// TestConfiguredHeadersReplaceTheClients: an upstream's configured field
// (a credential the gateway holds) replaces a client-sent field of the
// same name, whatever case the client wrote it in and however many times:
// the upstream sees the configured value alone, on every road a write
// takes (a body in memory, one that streams, one with a Connection field
// naming more).
func TestConfiguredHeadersReplaceTheClients(t *testing.T) {
	up := newHeadSink(t, []byte("ok"))
	tg := startFraming(t, up.URL, Config{UpstreamHeaders: map[string]http.Header{"svc": {"X-Upstream-Key": {"the gateway's"}}}}, false)
	forged := "X-Upstream-Key: forged\r\nx-upstream-key: forged too\r\n"
	for i, tc := range []struct{ name, head, body string }{
		{"in memory", "Content-Length: 3\r\n", "abc"},
		{"streamed", "Transfer-Encoding: chunked\r\n", "3\r\nabc\r\n0\r\n\r\n"},
		{"connection", "Content-Length: 3\r\nConnection: X-Other\r\nX-Other: 1\r\n", "abc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lease := tg.lease(t, "configured-"+strconv.Itoa(i))
			answers, bodies := final(tg.exchange(t, "POST /v1/proxy/svc/t HTTP/1.1\r\nHost: gw\r\nFencing-Lease: "+lease+"\r\n"+
				forged+tc.head+"Connection: close\r\n\r\n"+tc.body))
			if len(answers) != 1 || answers[0].StatusCode != http.StatusOK {
				t.Fatalf("answers %v %q, want one 200", answers, bodies)
			}
			header, _ := up.take()
			if len(header) != 1 {
				t.Fatalf("the upstream got %d requests", len(header))
			}
			if v := header[0].Values("X-Upstream-Key"); len(v) != 1 || v[0] != "the gateway's" {
				t.Errorf("the upstream got X-Upstream-Key %q, want the configured value alone", v)
			}
		})
	}
}
