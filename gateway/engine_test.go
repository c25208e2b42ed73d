package gateway

// The write's road (the direct forward over package engine) end to end,
// against the reference road, httputil.ReverseProxy over the plain
// Transport (oracle_test.go), and the engine's connections and failures as
// a client and the resource's drain see them.

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// seenRequest is what an upstream got, as its handler saw it.
type seenRequest struct {
	Method, URI, Host string
	Header            http.Header
	Body              string
	Length            int64
	TE                []string
}

// diffUpstream answers by path (see serve) and records every request by
// the value of its X-Case header.
type diffUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen map[string][]seenRequest
}

func newDiffUpstream(t testing.TB) *diffUpstream {
	u := &diffUpstream{seen: map[string][]seenRequest{}}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *diffUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h := r.Header.Clone()
	u.mu.Lock()
	u.seen[r.Header.Get("X-Case")] = append(u.seen[r.Header.Get("X-Case")], seenRequest{Method: r.Method, URI: r.RequestURI, Host: r.Host,
		Header: h, Body: string(body), Length: r.ContentLength, TE: r.TransferEncoding})
	u.mu.Unlock()
	if !strings.HasPrefix(r.URL.Path, "/known") {
		w.Header().Set("X-Upstream", "yes")
		w.Header().Add("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
	}
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/known"):
		// Fields of known names alone, none repeated nor hop-by-hop: the
		// common answer, which the engine lists as it reads it
		// (engine.Hooks.AnswerFields) and the client's head is written from.
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("ETag", `"k"`)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	case strings.HasPrefix(p, "/chunked"):
		w.Header().Set("Trailer", "X-Trail")
		_, _ = io.WriteString(w, "part one, ")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "part two")
		w.Header().Set("X-Trail", "end")
	case strings.HasPrefix(p, "/events"):
		w.Header().Set("Content-Type", "Text/Event-Stream; charset=utf-8")
		w.Header().Set("Content-Length", "21")
		_, _ = io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "data: two\n")
	case strings.HasPrefix(p, "/empty"):
		w.WriteHeader(http.StatusNoContent)
	case strings.HasPrefix(p, "/notmod"):
		w.Header().Set("ETag", `"x"`)
		w.WriteHeader(http.StatusNotModified)
	case strings.HasPrefix(p, "/big"):
		_, _ = io.WriteString(w, strings.Repeat("0123456789", 20_000))
	case strings.HasPrefix(p, "/close"):
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, "closing")
	case strings.HasPrefix(p, "/early"):
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		_, _ = io.WriteString(w, "after hints")
	case strings.HasPrefix(p, "/nolength"):
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		// A server that closes after an answer says so (RFC 9112 9.6);
		// one that does not leaves every client a race (engine.go).
		head := "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
		if r.Method != http.MethodHead {
			head += "until the connection closes"
		}
		_, _ = brw.WriteString(head)
		_ = brw.Flush()
		_ = c.Close()
	case strings.HasPrefix(p, "/status/"):
		code, _ := strconv.Atoi(strings.SplitN(strings.TrimPrefix(p, "/status/"), "/", 2)[0])
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "status "+strconv.Itoa(code))
	default:
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+strconv.Itoa(len(body)))
	}
}

func (u *diffUpstream) take(id string) []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.seen[id]
	delete(u.seen, id)
	return s
}

// answer is what a client got.
type answer struct {
	Status  int
	Header  http.Header
	Body    string
	Trailer http.Header
	Early   []string // the Link of each 1xx seen
}

// diffClient is the differential tests' client: its own connections,
// closed at the test's end.
func diffClient(t *testing.T) *http.Client {
	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// headerOf is a header of name, value pairs.
func headerOf(kv ...string) http.Header {
	out := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		out.Add(kv[i], kv[i+1])
	}
	return out
}

type diffCase struct {
	method, path string
	header       http.Header
	body         string
	chunked      bool // send the body with Transfer-Encoding: chunked
}

func (tg *testGateway) send(t *testing.T, c *http.Client, lease, id string, dc diffCase) answer {
	t.Helper()
	var body io.Reader
	if dc.body != "" || dc.chunked {
		body = strings.NewReader(dc.body)
	}
	req, err := http.NewRequest(dc.method, "http://"+tg.addr+"/v1/proxy/svc"+dc.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if dc.chunked {
		req.ContentLength = -1
		req.Body = io.NopCloser(strings.NewReader(dc.body))
	}
	for k, v := range dc.header {
		req.Header[k] = slices.Clone(v)
	}
	req.Header.Set("X-Case", id)
	req.Header.Set(HeaderLease, lease)
	var a answer
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			// 100 Continue is left out: with Expect, the gateway's own
			// server and the upstream (forwarded) may each send one, as
			// timing has it, through either path alike.
			if code != http.StatusContinue {
				a.Early = append(a.Early, strconv.Itoa(code)+" "+h.Get("Link"))
			}
			return nil
		},
	})
	resp, err := c.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s (%s): %v", dc.method, dc.path, id, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s %s (%s): reading the answer: %v", dc.method, dc.path, id, err)
	}
	a.Status, a.Header, a.Body, a.Trailer = resp.StatusCode, resp.Header, string(b), resp.Trailer
	a.Header.Del("Date")
	return a
}

// startDiff starts two gateways on one upstream: one forwarding by its own
// road (the direct forward over the engine), one by the reference road
// (useReverseProxy).
func startDiff(t testing.TB) (up *diffUpstream, eng, std *testGateway, engLease, stdLease string) {
	return startDiffWith(t, nil)
}

// startDiffWith is startDiff with both gateways' setup (startFramingWith).
func startDiffWith(t testing.TB, setup func(*bolt.Store, *Config, *http.Server)) (up *diffUpstream, eng, std *testGateway, engLease, stdLease string) {
	countDirect(t)
	up = newDiffUpstream(t)
	eng = startFramingWith(t, up.URL, Config{}, false, setup)
	// The reference: the reverse proxy, served by Go's server alone (no
	// own loop: framing.Listener without Own).
	std = withNetHTTPOnly(func() *testGateway { return startFramingWith(t, up.URL, Config{}, false, setup) })
	useReverseProxy(std)
	// Leases as long as allowed: a fuzz run outlives a minute, and every
	// write after its lease ran out would be refused alike by both
	// (compare would pass, having compared nothing).
	return up, eng, std, eng.leaseTTL(t, "r", time.Hour), std.leaseTTL(t, "r", time.Hour)
}

// directs counts the direct forwards (direct.go) of a test.
var directs atomic.Int64

// countDirect counts the direct forwards of t, which must not run in
// parallel with another test that does.
func countDirect(t testing.TB) {
	directs.Store(0)
	testHookDirect = func() { directs.Add(1) }
	t.Cleanup(func() { testHookDirect = nil })
}

// compare sends dc through both gateways and requires the same request at
// the upstream and the same answer at the client. Left out, and nothing
// else: the X-Case marker, X-Forwarded-Host (each gateway's own address)
// and a 100 Continue at the client (send: each gateway's server sends its
// own when the body is first read, on either road). Where the road differs
// from the reference on purpose (docs/design.md, "The write path": the
// fence check, the forward timeout as a connection deadline, when an
// answer that comes during the body is heard), the bytes do not.
func compare(t *testing.T, up *diffUpstream, eng, std *testGateway, engLease, stdLease string, c *http.Client, id string, dc diffCase) {
	t.Helper()
	ae := eng.send(t, c, engLease, id+"/engine", dc)
	as := std.send(t, c, stdLease, id+"/std", dc)
	se, ss := up.take(id+"/engine"), up.take(id+"/std")
	for _, code := range []string{tokens.CodeLeaseExpired, tokens.CodeStaleToken, tokens.CodeLeaseReleased} {
		if len(se)+len(ss) == 0 && (strings.Contains(ae.Body, `"`+code+`"`) || strings.Contains(as.Body, `"`+code+`"`)) {
			t.Fatalf("%s: refused with %s: the test's leases are no longer current, nothing can be compared", id, code)
		}
	}
	if len(se) == 0 && len(ss) == 0 && ae.Status >= 400 && fmt.Sprint(ae) == fmt.Sprint(as) {
		return // refused by the gateway before any forward, alike
	}
	if len(se) != 1 || len(ss) != 1 {
		t.Fatalf("%s: the upstream got %d requests through the engine and %d through the Transport, want 1 each (%+v: %d %s)", id, len(se), len(ss), dc, ae.Status, ae.Body)
	}
	norm := func(r seenRequest) string {
		h := r.Header.Clone()
		h.Del("X-Case")
		h.Del("X-Forwarded-Host") // each gateway's own address
		return fmt.Sprintf("%s %s host=%s len=%d te=%v body=%d:%q\n%v", r.Method, r.URI, r.Host, r.Length, r.TE, len(r.Body), truncate(r.Body, 64)+"~"+strconv.Itoa(int(crc32.ChecksumIEEE([]byte(r.Body)))), h)
	}
	if a, b := norm(se[0]), norm(ss[0]); a != b {
		t.Errorf("%s: the upstream got, through the engine:\n%s\nthrough the Transport:\n%s", id, a, b)
	}
	if fmt.Sprint(ae) != fmt.Sprint(as) {
		short := func(a answer) answer {
			a.Body = truncate(a.Body, 64) + "~" + strconv.Itoa(len(a.Body))
			return a
		}
		t.Errorf("%s: the client got, through the engine:\n%+v\nthrough the Transport:\n%+v", id, short(ae), short(as))
	}
	if se[0].Header.Get(HeaderLease) != "" || se[0].Header.Get(HeaderToken) != "1" || se[0].Header.Get(HeaderResource) != "r" {
		t.Errorf("%s: fencing headers at the upstream: %v", id, se[0].Header)
	}
}

// The same requests through the engine and through httputil.ReverseProxy
// reach the upstream alike (method, path, query, headers, body) and get
// the same answer, for every kind of answer the engine carries and for
// the requests it hands to the Transport.
func TestEngineMatchesReverseProxy(t *testing.T) {
	up, eng, std, el, sl := startDiff(t)
	c := diffClient(t)
	h := headerOf
	cases := []diffCase{
		{method: "POST", path: "/plain", body: "small body"},
		{method: "POST", path: "/known", body: "small body"},
		{method: "PUT", path: "/known", body: strings.Repeat("k", smallBody+1)},
		{method: "HEAD", path: "/known"},
		{method: "POST", path: "/plain/a%2Fb/c?x=1&y=%20z", body: strings.Repeat("e", smallBody)},
		{method: "PUT", path: "/plain", body: strings.Repeat("b", smallBody+1)},
		{method: "PATCH", path: "/plain", body: "streamed", chunked: true},
		{method: "POST", path: "/plain", body: ""},
		{method: "GET", path: "/plain?q=1"},
		{method: "DELETE", path: "/plain"},
		{method: "HEAD", path: "/plain"},
		{method: "OPTIONS", path: "/plain"},
		{method: "POST", path: "/chunked", body: "x"},
		{method: "POST", path: "/empty", body: "x"},
		{method: "GET", path: "/notmod"},
		{method: "GET", path: "/big"},
		{method: "POST", path: "/close", body: "x"},
		{method: "POST", path: "/early", body: "x"},
		{method: "POST", path: "/nolength", body: "x"},
		{method: "POST", path: "/status/404", body: "x"},
		{method: "POST", path: "/status/500", body: "x"},
		{method: "POST", path: "/plain", body: "x", header: h("Connection", "X-Hop", "X-Hop", "dropped", "Keep-Alive", "timeout=5", "X-Keep", "kept")},
		{method: "POST", path: "/plain", body: "x", header: h("X-Forwarded-For", "6.6.6.6", "Forwarded", "for=6.6.6.6", "Fencing-Token", "999", "Fencing-Resource", "other")},
		{method: "POST", path: "/plain", body: "x", header: h("X-Multi", "1", "X-Multi", "2", "Authorization", "Bearer upstream", "Accept-Encoding", "br")},
		{method: "POST", path: "/plain", body: "x", header: h("Te", "trailers")},
		{method: "POST", path: "/plain", body: "x", header: h("Expect", "100-continue")},
		{method: "POST", path: "/early", body: "x", header: h("Expect", "100-continue")},
		{method: "PUT", path: "/plain", body: strings.Repeat("c", smallBody+1), header: h("Expect", "100-continue")},
		{method: "PATCH", path: "/status/417", body: "streamed", chunked: true, header: h("Expect", "100-continue")},
		{method: "POST", path: "/plain", body: "x", header: h("User-Agent", "worker/1.0", "Content-Type", "application/json")},
		{method: "POST", path: "/events", body: "x"},
		{method: "POST", path: "/plain?a=1;b=2&c=%zz", body: "x"},
		{method: "POST", path: "/plain?a=%41&b=%", body: "x"},
		{method: "POST", path: "/plain", body: "x", header: h("Connection", "keep-alive, X-Drop", "X-Drop", "1", "Proxy-Connection", "keep-alive", "Upgrade-Insecure-Requests", "1")},
		// Hop-by-hop fields without a Connection field to name them (the
		// road leaves them out as it copies the header).
		{method: "POST", path: "/plain", body: "x", header: h("Keep-Alive", "timeout=5", "Proxy-Connection", "keep-alive", "Te", "gzip", "Proxy-Authorization", "Basic eA==", "X-Keep", "kept")},
		{method: "PUT", path: "/plain", body: "", header: h("Content-Type", "text/plain")},
		{method: "GET", path: "/plain", header: h("Accept", "a", "Accept", "b", "Cookie", "c=1")},
		// More fields that go than serveProxy's pass lists (writeFields):
		// the forward walks the header itself.
		{method: "POST", path: "/plain", body: "x", header: h("X-A", "1", "X-B", "2", "X-C", "3", "X-D", "4", "X-E", "5", "X-F", "6",
			"X-G", "7", "X-H", "8", "X-I", "9", "Keep-Alive", "timeout=5", "X-Forwarded-For", "6.6.6.6", "User-Agent", "worker/1.0")},
	}
	for i, dc := range cases {
		compare(t, up, eng, std, el, sl, c, "fixed-"+strconv.Itoa(i), dc)
	}
	if n := directs.Load(); n != int64(len(cases)) {
		t.Errorf("%d of %d cases took the direct forward, want all", n, len(cases))
	}
}

// Random requests, the same through both (seeded, so a failure repeats).
func TestEngineMatchesReverseProxyRandom(t *testing.T) {
	up, eng, std, el, sl := startDiff(t)
	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	rng := rand.New(rand.NewPCG(11, 11))
	methods := []string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}
	paths := []string{"/plain", "/known", "/chunked", "/empty", "/big", "/close", "/early", "/nolength", "/status/418", "/notmod", "/events"}
	segs := []string{"a", "b%20c", "d%2Fe", "~f", "g;h", "%C3%A9", "i+j"}
	names := []string{"X-A", "X-B", "Cache-Control", "If-Match", "Accept", "Content-Type", "X-Forwarded-Host", "Connection", "Cookie"}
	for i := range 150 {
		dc := diffCase{method: methods[rng.IntN(len(methods))], path: paths[rng.IntN(len(paths))], header: http.Header{}}
		for range rng.IntN(3) {
			dc.path += "/" + segs[rng.IntN(len(segs))]
		}
		if rng.IntN(2) == 0 {
			dc.path += "?k=" + segs[rng.IntN(len(segs))] + "&n=" + strconv.Itoa(rng.IntN(100))
		}
		for range rng.IntN(4) {
			n := names[rng.IntN(len(names))]
			v := "v" + strconv.Itoa(rng.IntN(10))
			if n == "Connection" {
				v = "X-A"
			}
			dc.header.Add(n, v)
		}
		if dc.method != "GET" && dc.method != "HEAD" && rng.IntN(3) > 0 {
			sizes := []int{1, 100, smallBody - 1, smallBody, smallBody + 1, 20_000}
			dc.body = strings.Repeat(string(rune('a'+rng.IntN(26))), sizes[rng.IntN(len(sizes))])
			dc.chunked = rng.IntN(5) == 0
		}
		compare(t, up, eng, std, el, sl, c, "random-"+strconv.Itoa(i), dc)
	}
	if directs.Load() == 0 {
		t.Error("no case took the direct forward")
	}
}

// The engine keeps connections alive across writes, finds the ones the
// upstream closed before it reuses them (so a write never goes out on a
// dead connection and drains its resource), and never reads one write's
// answer for another under concurrency.
func TestEngineConnections(t *testing.T) {
	var dials atomic.Int64
	var served atomic.Int64
	dropped := make(chan struct{}, 16) // an upstream connection was closed after its answer
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n := served.Add(1)
		if r.URL.Path == "/drop" {
			// Answer in full, then close without saying so, as an
			// upstream's idle timeout does.
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			_, _ = fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
			_ = brw.Flush()
			_ = c.Close()
			dropped <- struct{}{}
			return
		}
		if r.URL.Path == "/big" {
			_, _ = io.WriteString(w, strings.Repeat("B", 4<<20))
			return
		}
		if n%7 == 0 {
			time.Sleep(time.Millisecond) // let answers overtake one another
		}
		_, _ = io.WriteString(w, r.URL.Path+" "+string(b))
	}))
	t.Cleanup(up.Close)
	tg := startFraming(t, up.URL, Config{}, false)
	dial := tg.g.transport.DialContext
	tg.g.transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	lease := tg.lease(t, "conns")
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	write := func(path, body string) (int, string) {
		req, _ := http.NewRequest("POST", "http://"+tg.addr+"/v1/proxy/svc"+path, strings.NewReader(body))
		req.Header.Set(HeaderLease, lease)
		resp, err := c.Do(req)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for i := range 20 {
		if code, got := write("/seq", strconv.Itoa(i)); code != 200 || got != "/seq "+strconv.Itoa(i) {
			t.Fatalf("write %d: %d %q", i, code, got)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("20 writes one after the other dialled %d connections, want 1 kept alive", n)
	}
	for i := range 5 {
		if code, got := write("/drop", "d"+strconv.Itoa(i)); code != 200 || got != "d"+strconv.Itoa(i) {
			t.Fatalf("drop %d: %d %q", i, code, got)
		}
		// Once the upstream's close returned, its FIN is on the loopback:
		// the next write must find the connection closed.
		select {
		case <-dropped:
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream did not close its connection")
		}
	}
	res, err := tg.svc.Resource(context.Background(), "conns")
	if err != nil {
		t.Fatal(err)
	}
	if res.DrainUntil.After(time.Now()) {
		t.Fatalf("a write went out on a connection the upstream had closed: the resource drains (%+v)", res)
	}
	// Clients that go away in the middle of a long answer: the engine's
	// connection holds the rest of that answer and must never carry the
	// next write.
	for i := range 5 {
		conn, err := net.Dial("tcp", tg.addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(conn, "POST /v1/proxy/svc/big HTTP/1.1\r\nHost: gw\r\nFencing-Lease: "+lease+"\r\nContent-Length: 1\r\n\r\nb")
		buf := make([]byte, 64<<10)
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatalf("abort %d: %v", i, err)
		}
		_ = conn.Close()
		if code, got := write("/after", strconv.Itoa(i)); code != 200 || got != "/after "+strconv.Itoa(i) {
			t.Fatalf("the write after a client left mid-answer: %d %q", code, truncate(got, 40))
		}
	}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 25 {
				path, body := "/w"+strconv.Itoa(w), strconv.Itoa(i)+strings.Repeat("p", w*300)
				if code, got := write(path, body); code != 200 || got != path+" "+body {
					t.Errorf("%s #%d got %d %q", path, i, code, truncate(got, 40))
					return
				}
			}
		})
	}
	wg.Wait()
}

// A forward that times out answers 504 and drains; its connection is not
// reused, and the next write goes through. A response head over the limit
// is a 502, and an upstream that cannot be reached a 502 without a drain.
func TestEngineFailures(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/hang":
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
		case "/bighead":
			w.Header().Set("X-Big", strings.Repeat("h", 8<<10))
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(release) })
	tg := startFraming(t, up.URL, Config{ForwardTimeout: 300 * time.Millisecond}, false)
	tg.g.transport.MaxResponseHeaderBytes = 4 << 10 // the engine's limit too
	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	write := func(lease, path string) int {
		req, _ := http.NewRequest("POST", "http://"+tg.addr+"/v1/proxy/svc"+path, strings.NewReader("b"))
		req.Header.Set(HeaderLease, lease)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	draining := func(resource string) bool {
		// The drain is recorded in the background, after the answer.
		if err := tg.svc.WaitDrains(t.Context()); err != nil {
			t.Fatal(err)
		}
		res, err := tg.svc.Resource(context.Background(), resource)
		if err != nil {
			t.Fatal(err)
		}
		return res.DrainUntil.After(time.Now())
	}
	hang := tg.lease(t, "hang")
	if code := write(hang, "/hang"); code != http.StatusGatewayTimeout || !draining("hang") {
		t.Fatalf("a hung forward: %d, draining %v; want 504 and a drain", code, draining("hang"))
	}
	ok := tg.lease(t, "ok")
	if code := write(ok, "/fine"); code != 200 {
		t.Fatalf("the write after a timeout: %d", code)
	}
	big := tg.lease(t, "big")
	if code := write(big, "/bighead"); code != http.StatusBadGateway {
		t.Fatalf("a response head over the limit: %d, want 502", code)
	}
	down := startFraming(t, "http://127.0.0.1:1", Config{}, false)
	dl := down.lease(t, "down")
	req, _ := http.NewRequest("POST", "http://"+down.addr+"/v1/proxy/svc/x", strings.NewReader("b"))
	req.Header.Set(HeaderLease, dl)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	res, _ := down.svc.Resource(context.Background(), "down")
	if resp.StatusCode != http.StatusBadGateway || res.DrainUntil.After(time.Now()) {
		t.Fatalf("an unreachable upstream: %d, drain until %v; want 502 and no drain", resp.StatusCode, res.DrainUntil)
	}
}

// FuzzEngineMatchesReverseProxy: any request a client can send reaches
// the upstream the same through the engine and through the Transport, and
// gets the same answer. go test -fuzz FuzzEngineMatchesReverseProxy ./gateway/
func FuzzEngineMatchesReverseProxy(f *testing.F) {
	f.Add(uint8(1), "/plain/a", "x=1", "X-A", "v", []byte("body"), false)
	f.Add(uint8(0), "/chunked", "", "Connection", "X-A", []byte{}, false)
	f.Add(uint8(3), "/early/%C3%A9", "k=%2F", "Cache-Control", "no-cache", []byte(strings.Repeat("z", smallBody)), false)
	f.Add(uint8(2), "/big", "", "Te", "trailers", []byte(strings.Repeat("y", smallBody+1)), true)
	f.Add(uint8(5), "/nolength", "q", "Accept-Encoding", "gzip", []byte{}, false)
	up, eng, std, el, sl := startDiff(f)
	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	f.Cleanup(c.CloseIdleConnections)
	methods := []string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, m uint8, path, query, name, value string, body []byte, chunked bool) {
		u, err := url.Parse("http://gw/v1/proxy/svc" + path + "?" + query)
		if err != nil || !strings.HasPrefix(path, "/") || strings.ContainsAny(path, "?#") || u.Host != "gw" ||
			!validHeader(name, value) || len(body) > 16<<10 {
			return
		}
		dc := diffCase{method: methods[int(m)%len(methods)], path: path, header: http.Header{}, body: string(body), chunked: chunked && len(body) > 0}
		if query != "" {
			dc.path += "?" + query
		}
		dc.header.Add(name, value)
		compare(t, up, eng, std, el, sl, c, "fuzz-"+strconv.FormatInt(n.Add(1), 10), dc)
	})
}

// validHeader: a field the client would send as given (net/http refuses
// or rewrites others).
func validHeader(name, value string) bool {
	if name == "" || strings.TrimSpace(value) != value {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	switch http.CanonicalHeaderKey(name) {
	case "Host", "Content-Length", "Transfer-Encoding", "Fencing-Lease", "X-Case", "Expect", "Upgrade", "Trailer":
		return false
	}
	return true
}
