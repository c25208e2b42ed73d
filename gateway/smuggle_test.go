package gateway

// The differential smuggling test: raw requests (testdata/smuggling.txt),
// each on a connection of its own, sent as fenced writes through a real
// gateway listener to a real upstream, and sent as they are to Go's own
// HTTP server. The gateway may refuse more than Go's server (its framing
// rules), never less, and never with a 5xx; whatever it forwards is a
// request Go's server parsed from the same bytes, the same one. As the
// comparison is with net/http's server itself, a rule Go's server gains
// with a new toolchain fails here until the gateway has it too.

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// smuggleSeen is one request as a server's handler got it.
type smuggleSeen struct {
	Method, Target  string
	Header, Trailer http.Header
	Body            string
	BodyErr         bool   // the body could not be read to its end
	remote          string // the client's address
}

// smuggleSink serves HTTP and records what its handler gets, and the raw
// bytes its connections carried in.
type smuggleSink struct {
	srv    *http.Server
	addr   string
	prefix string // stripped from each target (the plain server gets the gateway's paths)
	mu     sync.Mutex
	seen   []smuggleSeen
	raw    bytes.Buffer
	note   chan struct{} // a request was recorded
}

func newSmuggleSink(t testing.TB, prefix string) *smuggleSink {
	t.Helper()
	s := &smuggleSink{prefix: prefix, note: make(chan struct{}, 1)}
	s.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10,
		ErrorLog: nil, Handler: http.HandlerFunc(s.serve)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	go func() { _ = s.srv.Serve(rawListener{ln, s}) }()
	t.Cleanup(func() { _ = s.srv.Close() })
	return s
}

func (s *smuggleSink) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	target := strings.TrimPrefix(r.URL.EscapedPath(), s.prefix)
	if s.prefix != "" && target == "" {
		target = "/" // the gateway forwards /v1/proxy/svc to the upstream's root
	}
	if r.URL.RawQuery != "" || r.URL.ForceQuery {
		target += "?" + r.URL.RawQuery
	}
	s.mu.Lock()
	s.seen = append(s.seen, smuggleSeen{Method: r.Method, Target: target, Header: r.Header.Clone(),
		Trailer: r.Trailer.Clone(), Body: string(body), BodyErr: err != nil, remote: r.RemoteAddr})
	s.mu.Unlock()
	select {
	case s.note <- struct{}{}:
	default:
	}
	if err != nil {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	_, _ = io.WriteString(w, "ok")
}

// waitFor waits until n requests that keep says are the input's were
// recorded since the last take, or for at most d.
func (s *smuggleSink) waitFor(n int, d time.Duration, keep func(smuggleSeen) bool) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		got := 0
		for _, x := range s.seen {
			if keep(x) {
				got++
			}
		}
		s.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-s.note:
		case <-deadline.C:
			return
		}
	}
}

// take returns what was seen since the last take that keep says is the
// input's (a request of an earlier input may arrive late), and forgets all.
func (s *smuggleSink) take(keep func(smuggleSeen) bool) ([]smuggleSeen, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var seen []smuggleSeen
	for _, x := range s.seen {
		if keep(x) {
			seen = append(seen, x)
		}
	}
	raw := s.raw.String()
	s.seen = nil
	s.raw.Reset()
	return seen, raw
}

type rawListener struct {
	net.Listener
	s *smuggleSink
}

func (l rawListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return rawConn{c, l.s}, nil
}

type rawConn struct {
	net.Conn
	s *smuggleSink
}

func (c rawConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.s.mu.Lock()
	c.s.raw.Write(p[:n])
	c.s.mu.Unlock()
	return n, err
}

// smuggleDiff is a gateway in front of an upstream sink, and a plain Go
// server beside them.
type smuggleDiff struct {
	tg       *testGateway
	up       *smuggleSink
	plain    *smuggleSink
	n        int
	idleWait time.Duration // how long an open connection may stay silent before its answers are taken as all
}

// newSmuggleDiff starts the three; tlsOn: clients speak TLS to the gateway
// (its listener terminates it; Go's server is still sent plaintext).
func newSmuggleDiff(t testing.TB, idleWait time.Duration, tlsOn bool) *smuggleDiff {
	t.Helper()
	d := &smuggleDiff{up: newSmuggleSink(t, ""), plain: newSmuggleSink(t, "/v1/proxy/svc"), idleWait: idleWait}
	d.tg = startFraming(t, "http://"+d.up.addr, Config{}, tlsOn)
	return d
}

// smuggleResult is what one input did at both.
type smuggleResult struct {
	gw, plain       []int // answer statuses, in order
	gwPlain         []int // the gateway's 4xx answers that were not problem documents
	gwClosed        bool  // the gateway closed the connection
	up, plainSeen   []smuggleSeen
	upRaw, plainRaw string
}

// expand fills in the corpus's shorthands; lease is the fenced write's.
func expand(raw, lease string) string {
	h := "Host: gw\r\nFencing-Lease: " + lease + "\r\n"
	raw = strings.ReplaceAll(raw, "${H}", h)
	raw = strings.ReplaceAll(raw, "$H", h)
	raw = strings.ReplaceAll(raw, "$P", "POST /v1/proxy/svc")
	return strings.ReplaceAll(raw, "$L", lease)
}

// run sends raw (shorthands unexpanded) to the gateway, under a fresh
// lease, and to the plain server, each on a connection of its own. wantUp:
// the requests the upstream is expected to record (an aborted one is
// recorded once its body broke off, which may be after the gateway
// answered).
func (d *smuggleDiff) run(t testing.TB, raw string, wantUp int) smuggleResult {
	t.Helper()
	d.n++
	resource := "smuggle-" + strconv.Itoa(d.n)
	lease := d.tg.lease(t, resource)
	in := expand(raw, lease)
	var r smuggleResult
	var client string
	r.gw, r.gwPlain, r.gwClosed, _ = d.send(t, d.tg.addr, d.tg.tls, in)
	r.plain, _, _, client = d.send(t, d.plain.addr, nil, in)
	ours := func(x smuggleSeen) bool { return x.Header.Get(HeaderResource) == resource }
	d.up.waitFor(wantUp, 5*time.Second, ours)
	r.up, r.upRaw = d.up.take(ours)
	// Go's server records a request whose body broke off once its read
	// fails, which may be only when send closed the connection: wait for
	// as many as the upstream got before comparing.
	byClient := func(x smuggleSeen) bool { return x.remote == client }
	d.plain.waitFor(len(r.up), 5*time.Second, byClient)
	r.plainSeen, r.plainRaw = d.plain.take(byClient)
	return r
}

// send writes in on a fresh connection and reads answers until the server
// closes it, or stays silent for idleWait (the corpus's inputs close their
// connections; only fuzzed ones may leave one open).
func (d *smuggleDiff) send(t testing.TB, addr string, tlsConfig *tls.Config, in string) (statuses, notProblem []int, closed bool, client string) {
	t.Helper()
	var c net.Conn
	var err error
	if tlsConfig != nil {
		cfg := tlsConfig.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		c, err = tls.Dial("tcp", addr, cfg)
	} else {
		c, err = net.Dial("tcp", addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	client = c.LocalAddr().String()
	if _, err := io.WriteString(c, in); err != nil {
		return nil, nil, true, client // the server closed before taking it all
	}
	br := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(d.idleWait))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			var ne net.Error
			return statuses, notProblem, !(errors.As(err, &ne) && ne.Timeout()), client
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 200 {
			statuses = append(statuses, resp.StatusCode)
		}
		if resp.StatusCode >= 400 && resp.Header.Get("Content-Type") != problemContentType {
			notProblem = append(notProblem, resp.StatusCode)
		}
	}
}

// smuggleHopHeaders are not compared: hop-by-hop fields, and those the gateway
// removes or sets on every forward (the fence, X-Forwarded-*).
var smuggleHopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding",
	"Upgrade", "Proxy-Authorization", "Proxy-Authenticate", "Content-Length", "Forwarded", "X-Real-Ip"}

// comparable is s as the comparison sees it.
func comparable(s smuggleSeen) smuggleSeen {
	// Trailer fields go on under the header's rules (trailers.go), and
	// an invalid name, which Go's server takes in a trailer, not at all.
	s.Trailer = comparableFields(s.Trailer, s.Header)
	s.Header = comparableFields(s.Header, s.Header)
	for k := range s.Trailer {
		if !validFieldName(k) || k == "Host" {
			delete(s.Trailer, k)
		}
	}
	if len(s.Trailer) == 0 {
		s.Trailer = nil
	}
	if s.BodyErr {
		s.Body, s.Trailer = "", nil // how much was read before the error is nobody's contract
	}
	return s
}

// comparableFields is h without the fields the comparison ignores: those
// named in header's Connection, hop-by-hop ones and the gateway's own.
func comparableFields(h, header http.Header) http.Header {
	if h == nil {
		return nil
	}
	h = h.Clone()
	for _, v := range header["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range smuggleHopHeaders {
		h.Del(k)
	}
	for k := range h {
		if strings.HasPrefix(k, "Fencing-") || strings.HasPrefix(k, "X-Forwarded-") {
			delete(h, k)
		}
	}
	return h
}

func sameRequest(a, b smuggleSeen) bool {
	a, b = comparable(a), comparable(b)
	return a.Method == b.Method && a.Target == b.Target && a.Body == b.Body && a.BodyErr == b.BodyErr &&
		headersEqual(a.Header, b.Header) && headersEqual(a.Trailer, b.Trailer)
}

func headersEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// checkInvariants holds for any input: no 5xx from the gateway, every 4xx
// a problem document (docs/design.md: bad input gets a clear 4xx naming what is
// wrong, also where Go's server answered it itself), and every
// request the upstream got is one Go's server got from the same bytes, in
// the same order (the gateway may drop requests, by refusing them, never
// change or add one).
func (r smuggleResult) checkInvariants() error {
	for _, s := range r.gw {
		if s >= 500 {
			return fmt.Errorf("the gateway answered %d (answers %v)", s, r.gw)
		}
	}
	if len(r.gwPlain) > 0 {
		return fmt.Errorf("the gateway answered %v not as problem documents (answers %v)", r.gwPlain, r.gw)
	}
	j := 0
	for i, u := range r.up {
		for j < len(r.plainSeen) && !sameRequest(u, r.plainSeen[j]) {
			j++
		}
		if j == len(r.plainSeen) {
			return fmt.Errorf("the upstream got request %d, %+v, which Go's server did not parse from the same bytes (it got %+v)", i, comparable(u), mapSeen(r.plainSeen))
		}
		j++
	}
	return nil
}

func mapSeen(s []smuggleSeen) []smuggleSeen {
	out := make([]smuggleSeen, len(s))
	for i := range s {
		out[i] = comparable(s[i])
	}
	return out
}

// accepted is the requests Go's server took whole, up to the first it did
// not.
func accepted(s []smuggleSeen) []smuggleSeen {
	for i := range s {
		if s[i].BodyErr {
			return s[:i]
		}
	}
	return s
}

// check holds r to what the corpus expects of its input.
func (r smuggleResult) check(expect string) error {
	if err := r.checkInvariants(); err != nil {
		return err
	}
	ok := accepted(r.plainSeen)
	n := len(r.up)
	if expect == "aborted" {
		if n == 0 || !r.up[n-1].BodyErr || len(r.gw) < n || r.gw[n-1] < 400 || r.gw[n-1] >= 500 {
			return fmt.Errorf("want the last request forwarded, its body broken off and the gateway's answer 4xx: upstream %+v, answers %v", mapSeen(r.up), r.gw)
		}
		return nil
	}
	for _, u := range r.up {
		if u.BodyErr {
			return fmt.Errorf("the upstream got a request whose body broke off: %+v", comparable(u))
		}
	}
	if n > len(ok) {
		return fmt.Errorf("the upstream got %d requests, Go's server took %d", n, len(ok))
	}
	for i, s := range r.gw[:min(n, len(r.gw))] {
		if s != http.StatusOK {
			return fmt.Errorf("the gateway's answer %d to a forwarded request is %d (answers %v)", i, s, r.gw)
		}
	}
	refusedNext := func() error {
		if len(r.gw) > n && (r.gw[n] < 400 || r.gw[n] >= 500) {
			return fmt.Errorf("the gateway answered the request after the %d it forwarded with %d, want a 4xx (answers %v)", n, r.gw[n], r.gw)
		}
		if len(r.gw) <= n && !r.gwClosed {
			return fmt.Errorf("the gateway neither answered nor closed after %d forwarded requests", n)
		}
		return nil
	}
	switch expect {
	case "same":
		if n == 0 || n != len(r.plainSeen) || n != len(ok) || len(r.gw) != n {
			return fmt.Errorf("want every request taken by both: upstream got %d, Go's server %d (%d whole); the gateway answered %v", n, len(r.plainSeen), len(ok), r.gw)
		}
	case "refused":
		if n != len(ok) {
			return fmt.Errorf("want refused by both: the upstream got %d requests, Go's server took %d", n, len(ok))
		}
		if len(r.gw) <= n || r.gw[n] < 400 || r.gw[n] >= 500 {
			return fmt.Errorf("want refused by both: the gateway answered %v after %d forwarded requests", r.gw, n)
		}
		if len(r.plain) > len(ok) && r.plain[len(ok)] < 400 {
			return fmt.Errorf("want refused by both: Go's server answered %v", r.plain)
		}
	case "stricter":
		if n >= len(ok) {
			return fmt.Errorf("want refused by the gateway alone: the upstream got %d requests, Go's server took %d", n, len(ok))
		}
		return refusedNext()
	default:
		return fmt.Errorf("unknown expectation %q", expect)
	}
	return nil
}

type smuggleCase struct{ name, expect, raw string }

// readSmuggling reads testdata/smuggling.txt.
func readSmuggling(t testing.TB) []smuggleCase {
	t.Helper()
	data, err := os.ReadFile("testdata/smuggling.txt")
	if err != nil {
		t.Fatal(err)
	}
	var cases []smuggleCase
	for i, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			t.Fatalf("testdata/smuggling.txt:%d: want name, expectation and a quoted request", i+1)
		}
		q := strings.TrimSpace(line[strings.Index(line, `"`):])
		raw, err := strconv.Unquote(q)
		if err != nil {
			t.Fatalf("testdata/smuggling.txt:%d: %v", i+1, err)
		}
		cases = append(cases, smuggleCase{f[0], f[1], raw})
	}
	return cases
}

// Every input of the corpus, on its own connection, does at the gateway
// what the corpus says, against Go's own server.
func TestSmugglingCorpus(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "TLS"}[tlsOn], func(t *testing.T) { testSmugglingCorpus(t, tlsOn) })
	}
}

func testSmugglingCorpus(t *testing.T, tlsOn bool) {
	d := newSmuggleDiff(t, 5*time.Second, tlsOn)
	for _, c := range readSmuggling(t) {
		start := time.Now()
		wantUp := 0
		if c.expect == "aborted" {
			wantUp = 1
		}
		r := d.run(t, c.raw, wantUp)
		if el := time.Since(start); el > time.Second {
			t.Logf("%s: %v", c.name, el)
		}
		if err := r.check(c.expect); err != nil {
			t.Errorf("%s (%s): %v\n  gateway answers %v (closed %v), Go's server %v\n  upstream got %q\n  Go's server got %q",
				c.name, c.expect, err, r.gw, r.gwClosed, r.plain, r.upRaw, r.plainRaw)
		}
	}
}

// Any bytes, seeded with the corpus: the gateway never answers 5xx and
// never forwards a request Go's server would not have parsed the same way.
func FuzzSmuggling(f *testing.F) {
	for _, c := range readSmuggling(f) {
		f.Add(c.raw)
	}
	// A fuzzed input may leave a connection open: its answers are taken
	// as all after a short silence (a late request is told apart by its
	// resource or connection, so it cannot be blamed on the next input).
	d := newSmuggleDiff(f, 200*time.Millisecond, false)
	f.Fuzz(func(t *testing.T, raw string) {
		if len(raw) > 8<<10 {
			return
		}
		r := d.run(t, raw, 0)
		if err := r.checkInvariants(); err != nil {
			t.Fatalf("%v\n  gateway answers %v, Go's server %v\n  upstream got %q\n  Go's server got %q", err, r.gw, r.plain, r.upRaw, r.plainRaw)
		}
	})
}
