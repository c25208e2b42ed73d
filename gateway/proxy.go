package gateway

// The fenced write's handler: serveProxy takes /v1/proxy/{upstream}/...,
// checks the request, admits it (tokens.Service.Admit), and hands it to the
// one road (direct.go, over the engine); forward is the write's state from
// admission to answer, rewrite builds the upstream's request, and the
// forward's failures are answered here.

import (
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fencegw/fencegw/gateway/internal/wire"
	"github.com/fencegw/fencegw/internal/failpoint"
	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// Header names of the fencing protocol.
const (
	HeaderLease    = "Fencing-Lease"
	HeaderToken    = "Fencing-Token"
	HeaderResource = "Fencing-Resource"
)

const proxyPrefix = "/v1/proxy/"

// forward is the state of one fenced write, from its admission to its
// answer: the handler's, the engine's (its Write: sendcheck.go) and the
// direct forward's (direct.go).
type forward struct {
	live   *live // the configuration that admitted it (live.go)
	permit *tokens.Permit
	// admission is the storage of permit (Service.AdmitInto): one
	// allocation less per write.
	admission tokens.Permit
	name      string // the upstream's name
	upstream  *url.URL
	path      string // unescaped path below the upstream's base
	rawPath   string // its escaped form, as the client sent it
	token     string
	instance  string // the client's request path, for problem documents
	// wroteRequest is set once the request's head was written to the
	// upstream's connection (engine.Hooks.WroteHeaders, the one report of
	// it): from then on, a failure leaves the outcome unknown.
	wroteRequest atomic.Bool
	// fenceLost: the fence could not be proven held before a send
	// (sendcheck.go); sent: some of the request's bytes had been handed
	// to the upstream's connection by then (or ever).
	fenceLost, sent atomic.Bool
	body            *bodyGuard // nil without a body (else guard)
	guard           bodyGuard  // storage for body
	rc              http.ResponseController
	// buffered is the whole body of a small write, read before the
	// forward (smallbody.go); nil if the body streams.
	buffered   []byte
	unknown    bool
	failed     bool
	badRequest bool        // failed by the client's fault (its body)
	keyed      *keyed      // nil without an Idempotency-Key (idempotency.go)
	trace      *writeTrace // nil without tracing (tracing.go)
	status     int         // the upstream's answer, once it came
	// deadline is the forward's (its timeout from the start of the
	// forward): a proof of the fence waits no longer (sendcheck.go).
	deadline time.Time
	// tokenText is the storage of token's bytes (tokenString).
	tokenText [20]byte
	// fields is what the forward asks of the client's header (writefields.go).
	fields forwardFields
	// answer is the list the client's answer's fields may be listed in
	// beside its header (framing.Verdict.Answer); nil: none.
	answer *wire.Fields
}

// setUpstreamURL is pr.SetURL(upstream). For an upstream named by its
// scheme and host alone (no path, no query) and a path of its own escaped
// form, SetURL's joins leave the path and the query as they are: only the
// scheme and the host are set (and the Host field cleared), without its
// calls and concatenations (about 200 instructions a write).
// TestSetUpstreamURLIsSetURL holds the two equal.
func setUpstreamURL(pr *httputil.ProxyRequest, upstream *url.URL) {
	out := pr.Out.URL
	if upstream.Path != "" || upstream.RawPath != "" || upstream.RawQuery != "" ||
		out.RawPath != "" || !strings.HasPrefix(out.Path, "/") {
		pr.SetURL(upstream)
		return
	}
	out.Scheme, out.Host = upstream.Scheme, upstream.Host
	pr.Out.Host = ""
}

// tokenString is strconv.FormatInt(token, 10) in the storage of one
// write's state, which is never reused, and never written again: a token
// of any size costs no allocation (FormatInt allocates from 100 on, so
// every write past a resource's hundredth grant paid one).
func tokenString(buf *[20]byte, token int64) string {
	b := strconv.AppendInt(buf[:0], token, 10)
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// rewrite turns the client's request into the upstream's, in the direct
// forward (direct.go), as a Rewrite of httputil.ReverseProxy would (the
// tests' reference road is one with this Rewrite): pr.Out's URL, and h,
// its header (pr.Out.Header is not read).
//
// vals holds the values of the headers it sets (one allocation, or none
// where the caller lends it). clean: the caller left the client's
// forwarding fields out of h as it copied them (one pass over the fields
// less).
func (g *Gateway) rewrite(pr *httputil.ProxyRequest, h *wire.Fields, f *forward, vals *[4]string, clean bool) {
	pr.Out.URL.Path, pr.Out.URL.RawPath = f.path, f.rawPath
	if f.rawPath == f.path && wire.PlainPath(f.path) {
		// The path is its own escaped form: without a RawPath, SetURL
		// joins it to the upstream's as it is, and the engine writes it
		// as it is (wire.EscapedPath), where each would check a RawPath
		// against it first. The bytes upstream are the same.
		pr.Out.URL.RawPath = ""
	}
	// The query as the client sent it, byte for byte (a reverse proxy
	// drops the parameters url.ParseQuery refuses, a ';', a bad escape,
	// more than 10,000, before Rewrite: a change to the request Go's
	// server parsed). The gateway decides nothing on the query, so there
	// is no reading of it to disagree with the upstream's.
	pr.Out.URL.RawQuery = pr.In.URL.RawQuery
	setUpstreamURL(pr, f.upstream)
	// The lease is a secret between worker and gateway; the token,
	// the resource and the forwarding facts are the gateway's word,
	// never the client's: every client-sent Fencing-*, Forwarded,
	// X-Forwarded-* and X-Real-Ip is dropped before the gateway's own
	// are set.
	if !clean {
		h.DelFunc(forwardingHeader)
	}
	// The fields the gateway sets are not in h now: each is added, not
	// set (Set looks for the name first: 450 instructions a write), in
	// the order of their names, which the head is sorted in (wire.Fields.Sort
	// moves each past the names before it that sort after it): the
	// fencing fields, then what ProxyRequest.SetXForwarded sets (the
	// client-sent ones were dropped above).
	vals[2], vals[3] = f.token, f.permit.Lease.Resource
	h.Add(HeaderResource, vals[3:4:4])
	h.Add(HeaderToken, vals[2:3:3])
	if ip, ok := remoteIP(pr.In.RemoteAddr); ok {
		vals[0] = ip
		h.Add("X-Forwarded-For", vals[0:1:1])
	}
	// The client's Host is the gateway's word only when the Host
	// check vouched for it (hosts.go); otherwise it is dropped.
	if !f.live.hosts.any {
		vals[1] = pr.In.Host
		h.Add("X-Forwarded-Host", vals[1:2:2])
	}
	if pr.In.TLS == nil {
		h.Add("X-Forwarded-Proto", protoHTTP[:1:1])
	} else {
		h.Add("X-Forwarded-Proto", protoHTTPS[:1:1])
	}
	// Trailer fields go on under the same rules (trailers.go), announced
	// and copied in at the body's end.
	g.forwardTrailer(pr.Out, pr.In, f.name)
	// With authentication the client's Authorization is its key at
	// the gateway, not a credential for the upstream.
	if f.live.auth != nil {
		h.Del("Authorization")
	}
	if len(f.live.headers) > 0 { // most gateways set none: no lookup, no walk of a nil map (70 instructions)
		for k, v := range f.live.headers[f.name] {
			h.Set(k, v)
		}
	}
	f.trace.inject(g.tr, h)
}

// remoteIP is the host of a request's RemoteAddr, as net.SplitHostPort
// finds it, and whether it does. An address with one colon and no
// brackets (IPv4's) is taken by four searches a SIMD block at a time,
// about 100 instructions a write; SplitHostPort took 280 (its search for
// the last colon goes a byte at a time).
func remoteIP(addr string) (string, bool) {
	i := strings.IndexByte(addr, ':')
	if i >= 0 && strings.IndexByte(addr[i+1:], ':') < 0 && strings.IndexByte(addr, '[') < 0 && strings.IndexByte(addr, ']') < 0 {
		return addr[:i], true
	}
	ip, _, err := net.SplitHostPort(addr)
	return ip, err == nil
}

// X-Forwarded-Proto values, shared (read only: capacity clipped where used).
var protoHTTP, protoHTTPS = []string{"http"}, []string{"https"}

// newTransport is the configuration of the engine's upstream connections
// (engine.New: dial, idle connections, TLS, response head limit), tuned
// for many concurrent writes to a few upstreams; the engine never hands it
// a request. DisableCompression is for the tests' reference road, which
// sends through it: without it the Transport asks for gzip when the client
// did not and unzips the answer.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil, // never an address from the environment
		DisableCompression:    true,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// serveProxy handles /v1/proxy/{upstream}/{path...}.
func (g *Gateway) serveProxy(w http.ResponseWriter, r *http.Request) {
	// What the road asks of the header, read in one pass.
	sc := scopeOf(r) // asked five things below: looked up once
	var wf writeFields
	readWriteFields(r.Header, sc.sentFields(), &wf)
	if err := checkWriteRequest(r, &wf); err != nil { // pathrule.go
		g.metrics.write(outcomeBadRequest)
		if errors.Is(err, problems.ErrMethodNotAllowed) {
			w.Header().Set("Allow", proxyMethods) // RFC 9110 15.5.6
		}
		writeProblem(w, r, g.log, err)
		return
	}
	name, rawPath := strings.TrimPrefix(wire.EscapedPath(r.URL), proxyPrefix), "/"
	if i := strings.IndexByte(name, '/'); i >= 0 {
		name, rawPath = name[:i], name[i:] // the path keeps its '/': no concatenation
	}
	lc := g.liveIn(sc) // one configuration judges the whole write (live.go)
	base, found := lc.upstreams[name]
	if !found {
		g.metrics.write(outcomeUnknownUpstream)
		p := problemOf(problems.ErrUnknownUpstream)
		p.Detail = "no upstream named " + strconv.Quote(truncate(name, 64)) + " is configured"
		sendProblem(w, r, p)
		return
	}
	if k := upstreamLookalike(r.Header, lc.headers[name]); k != "" {
		g.metrics.write(outcomeBadRequest)
		writeProblem(w, r, g.log, lookalikeError(k))
		return
	}
	path, err := checkProxyPath(rawPath) // pathrule.go
	if err != nil {
		g.metrics.write(outcomeBadRequest)
		writeProblem(w, r, g.log, err)
		return
	}
	leaseID := wire.First(wf.lease)
	if leaseID == "" {
		g.metrics.write(outcomeBadRequest)
		p := problemOf(problems.ErrMissingLease)
		p.Detail = "a fenced write needs a " + HeaderLease + " header"
		sendProblem(w, r, p)
		return
	}
	if r.ContentLength > g.cfg.MaxBody {
		g.metrics.write(outcomeBadRequest)
		writeProblem(w, r, g.log, &http.MaxBytesError{Limit: g.cfg.MaxBody})
		return
	}
	buffer := bufferable(r, &wf) // its Content-Length is within MaxBody
	if r.Body != nil && r.Body != http.NoBody && !buffer {
		r.Body = http.MaxBytesReader(w, r.Body, g.cfg.MaxBody)
	}
	// The write's state, with its response controller and its body's
	// guard (the rest is set once it is admitted).
	f := newForward(sc)
	f.fields, f.answer = wf.forward, sc.answerFields()
	f.rc = *http.NewResponseController(w)
	// The write deadline set below is lifted by net/http itself once the
	// answer is flushed (not earlier: the flush is bounded too).
	rc := &f.rc
	now := time.Now() // one reading for both deadlines: they are set microseconds apart
	guard := limitBodyRead(rc, r, now, g.cfg.BodyTimeout, &f.guard)
	kw, ok := g.keyedWrite(w, r, &wf)
	if !ok {
		return
	}
	// A client that does not take its answer must not hold the resource's
	// shared lock (and so its grants) for longer than this.
	_ = rc.SetWriteDeadline(now.Add(g.cfg.ForwardTimeout + g.cfg.BodyTimeout))

	write := tokens.Write{Method: r.Method, Upstream: name, Path: truncateUTF8(path, 512), Principal: nameOf(sc.caller())}
	if len(lc.observe) > 0 {
		write.Observe = lc.observe[name]
	}
	wt, actx := g.beginWrite(r.Context(), name) // tracing.go; actx is r's context without tracing
	if wt != nil {
		write.TraceID = wt.traceID()
	}
	permit, err := g.svc.AdmitInto(actx, leaseID, write, &f.admission)
	if err == nil {
		// The owner acquired it within its prefixes; this catches a key
		// whose prefixes were narrowed since. Both refusals are recorded.
		if err = mayUseAs(sc.caller(), permit.Lease.Resource); err == nil {
			err = lc.bindings.check(name, rawPath, permit.Lease.Resource, permit.Lease.Token) // routes.go
		}
		if err != nil {
			err = permit.Refuse(actx, err, write)
		}
	}
	if wt != nil {
		resource, token := "", int64(0)
		var would error
		if permit != nil {
			resource, token, would = permit.Lease.Resource, permit.Lease.Token, permit.WouldRefuse
		}
		wt.admitted(resource, token, err, would)
	}
	if err == nil && permit.WouldRefuse != nil {
		g.metrics.wouldRefuse(name, permit.WouldRefuse)
	}
	if err != nil {
		g.metrics.refused(r.Context(), err)
		g.metrics.refusedBy(write.Principal, err)
		writeProblem(w, r, g.log, err)
		return
	}
	if kw != nil && (!g.readKeyedBody(w, r, rawPath, kw) || !g.beginKeyed(w, r, kw, permit, name)) {
		permit.Done(tokens.OutcomeKnown)
		return
	}
	ownBody(w) // admitted: the forward's answer is the body's (early.go)
	f.live, f.permit, f.name, f.upstream, f.path, f.rawPath = lc, permit, name, base, path, rawPath
	f.token, f.instance, f.body, f.keyed = tokenString(&f.tokenText, permit.Lease.Token), r.URL.Path, guard, kw
	g.carry(w, rc, r, f, wt, buffer, wf.listed())
}

// carry carries the admitted write f to its end: its body read if it is
// small, the exchange, and the end of its permit whatever happens. A
// function of its own, with few returns, so that its deferred calls are
// open-coded: serveProxy's many returns made the compiler record each
// defer on the heap's side (runtime.deferreturn, about 1,000 instructions
// a write).
func (g *Gateway) carry(w http.ResponseWriter, rc *http.ResponseController, r *http.Request, f *forward, wt *writeTrace, buffer bool, listed []wire.Field) {
	permit := f.permit
	g.inflight.Add(1)
	start := time.Now()
	slot := g.ages.begin(start)
	// Done runs even if the proxy aborts the handler with a panic
	// (http.ErrAbortHandler on a broken response copy): a leaked shared lock
	// would block every future grant of the resource.
	defer func() {
		if f.keyed != nil {
			g.endKeyed(f)
		}
		outcome := tokens.OutcomeKnown
		if f.unknown {
			outcome = tokens.OutcomeUnknown
		}
		permit.Done(outcome)
		g.inflight.Add(-1)
		g.ages.end(slot)
		g.metrics.forwarded(f, time.Since(start))
		f.trace.endForward(f)
		if !f.failed && g.cfg.OnForwarded != nil {
			g.cfg.OnForwarded(permit.Lease.Resource, permit.Lease.Token)
		}
	}()

	// The direct forward's state, with the small body's buffer: its
	// engine keeps nothing of the body once its exchange is over (the
	// tests' reference road, whose Transport may still be writing it,
	// takes a buffer of its own).
	var st *directState
	if g.forwardVia == nil {
		st = takeDirect()
		defer giveDirect(st)
	}
	switch {
	case f.keyed != nil:
		f.buffered = f.keyed.body // read whole for its fingerprint
	case buffer:
		var buf []byte
		if st != nil {
			buf = st.small[:]
		}
		var err error
		if f.buffered, err = readSmallBody(r.Body, r.ContentLength, buf); err != nil {
			g.refuseBody(w, r, f, err)
			return
		}
	}

	wt.beginForward(r.Context(), g.tr, f)
	if g.forwardVia != nil {
		g.forwardVia(w, r, f) // tests: the reference road
		return
	}
	g.forwardDirect(w, rc, r, f, listed, st) // direct.go
}

// proxyMethods are the methods the proxy forwards (every one but CONNECT),
// as a 405's Allow field names them.
const proxyMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE"

// newForward returns the storage of the fenced write's state, zero: the
// one its request's scope s holds (the framing middleware's requestState,
// no allocation of its own), or a new one.
func newForward(s *scope) *forward {
	if s != nil && s.write != nil {
		f := s.write
		s.write = nil // one write per request
		return f
	}
	return new(forward)
}

// forwardFailed answers a forward that got no response from the upstream;
// timedOut: the forward timeout ran out.
func (g *Gateway) forwardFailed(w http.ResponseWriter, r *http.Request, f *forward, err error, timedOut bool) {
	f.failed = true
	if f.fenceLost.Load() {
		g.refuseLostFence(w, r, f)
		return
	}
	var maxBytes *http.MaxBytesError
	broken := f.body.brokenBy() // a malformed chunked body, a client gone mid-body
	if bodyTimeout, tooLarge := f.body.ranOut(timedOut), errors.As(err, &maxBytes); bodyTimeout || tooLarge || broken != nil {
		// The client's body was cut short: too slow (408), too large
		// (413) or malformed (400), its fault and not the upstream's. The upstream never got a
		// complete request, but once the request's head left it may have
		// acted on the part of the body it read (an upstream that streams
		// a body in may commit line by line) and may still be doing so when
		// the next holder writes: like any forward that failed after the
		// request left, the outcome is unknown and the resource drains.
		f.badRequest = true
		f.unknown = f.wroteRequest.Load()
		switch {
		case bodyTimeout:
			err = f.body.err(err)
		case !tooLarge:
			err = tokens.Invalid("body", "could not be read ("+broken.Error()+")")
		}
		p, _ := problemFor(err)
		p.Instance, p.Resource = f.instance, f.permit.Lease.Resource
		if f.unknown {
			p.Detail += "; the upstream got an incomplete request whose outcome is unknown, and the resource is closed to grants for the drain period"
		} else {
			p.Detail += "; nothing was forwarded"
		}
		sendProblem(w, r, p)
		return
	}
	// Once the request left, the upstream may act on it whatever we saw.
	f.unknown = f.wroteRequest.Load()
	if timedOut {
		if failpoint.UnlockOnTimeout {
			f.unknown = false // no drain: the lock is released at once
		}
		p := problemOf(problems.ErrUpstreamTimeout)
		p.Instance, p.Resource = f.instance, f.permit.Lease.Resource
		p.Detail = "the upstream did not answer within " + g.cfg.ForwardTimeout.String() + "; the outcome is unknown and the resource is closed to grants for the drain period"
		sendProblem(w, r, p)
		return
	}
	detail := "the upstream could not be reached"
	if f.unknown {
		detail = "the connection to the upstream broke after the request was sent; the outcome is unknown and the resource is closed to grants for the drain period"
	}
	p := problemOf(problems.ErrUpstreamUnreachable)
	p.Instance, p.Resource, p.Detail = f.instance, f.permit.Lease.Resource, detail
	sendProblem(w, r, p)
}

// refuseLostFence answers a write whose fence could not be proven held
// before a send (sendcheck.go): 503 fence_lost, saying whether any of it
// had reached the upstream's connection. If some had, the outcome is
// unknown: Done drains the resource (if the store can still be reached;
// if not, the presence row of the lost session makes the next grant drain
// anyway).
func (g *Gateway) refuseLostFence(w http.ResponseWriter, r *http.Request, f *forward) {
	sent := f.sent.Load()
	f.unknown = sent
	detail := "this replica could no longer prove it holds the resource's fence (its lock session was lost or not confirmed alive lately); nothing was forwarded"
	if sent {
		detail = "this replica could no longer prove it holds the resource's fence (its lock session was lost or not confirmed alive lately) while the request was being sent; the exchange was reset before the request was complete, the outcome is unknown and the resource is closed to grants for the drain period"
	}
	p := problemOf(tokens.ErrFenceLost)
	p.Instance, p.Resource, p.Detail = f.instance, f.permit.Lease.Resource, detail
	p.Token, p.Sent = &f.permit.Lease.Token, &sent
	sendProblem(w, r, p)
}

// refuseBody answers a small write whose body could not be read in whole
// before the forward: too slow (408) or cut short (400), the client's
// fault, and nothing was forwarded, so the outcome is known and the
// resource does not drain.
func (g *Gateway) refuseBody(w http.ResponseWriter, r *http.Request, f *forward, err error) {
	f.failed, f.badRequest = true, true
	switch {
	case errors.Is(err, problems.ErrRequestTimeout):
	case f.body.ranOut(false):
		err = f.body.err(err)
	case errors.Is(err, errShortBody):
		err = tokens.Invalid("body", "ended before its Content-Length")
	default:
		err = tokens.Invalid("body", "could not be read: "+err.Error())
	}
	p, _ := problemFor(err)
	p.Instance, p.Resource = f.instance, f.permit.Lease.Resource
	p.Detail += "; nothing was forwarded"
	sendProblem(w, r, p)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// bufferPool lends the direct forward 32 KiB copy buffers (and the tests'
// reference road, as an httputil.BufferPool). Taken only while an answer's
// body is copied: a write that waits for its upstream holds none.
type bufferPool struct{ p sync.Pool }

func newBufferPool() *bufferPool {
	return &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32*1024); return &b }}}
}

func (b *bufferPool) Get() []byte  { return *(b.p.Get().(*[]byte)) }
func (b *bufferPool) Put(v []byte) { b.p.Put(&v) }

// take and give lend the direct forward the same buffers by pointer:
// httputil.BufferPool's Put takes a slice, which allocates its header
// each time it goes back into the sync.Pool.
func (b *bufferPool) take() *[]byte  { return b.p.Get().(*[]byte) }
func (b *bufferPool) give(v *[]byte) { b.p.Put(v) }
