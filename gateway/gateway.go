// Package gateway is fencegw's HTTP layer: the control API (through the
// generated strict server), the fenced reverse proxy, the live rejection
// stream, health, readiness and metrics. It speaks to the domain through
// *tokens.Service, *tokens.Idempotency (Idempotency-Key records) and
// *tokens.Clocks (holder clock offsets); of tokens it otherwise uses types,
// errors and the input rules (limits, lease id redaction), and it imports
// no store. Every refusal it answers gets its status, code and title from
// the one table in internal/problems (problem.go writes the document).
package gateway

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegw/fencegw/api/server"
	"github.com/fencegw/fencegw/gateway/internal/engine"
	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// Defaults of Config.
const (
	DefaultForwardTimeout = 30 * time.Second
	DefaultMaxBody        = 10 << 20
	DefaultMaxControlBody = 64 << 10
	DefaultBodyTimeout    = 30 * time.Second
	DefaultWriteTimeout   = 30 * time.Second
)

// Config configures a Gateway. Zero fields take the defaults. Upstreams,
// UpstreamHeaders, Auth, AllowedHosts, Routes and Observe are the live
// configuration's first value: Reload replaces them as one (live.go).
type Config struct {
	// Upstreams maps names to base URLs. The gateway forwards only there,
	// never to an address a client names.
	Upstreams map[string]*url.URL
	// ForwardTimeout bounds one forward; past it the write answers 504 and
	// the resource drains (the outcome is unknown).
	ForwardTimeout time.Duration
	MaxBody        int64 // fenced write bodies
	MaxControlBody int64 // control call bodies
	// BodyTimeout bounds reading one request body, so that a slow client
	// is cut off (default DefaultBodyTimeout). Responses of fenced writes
	// must be taken within ForwardTimeout+BodyTimeout.
	BodyTimeout time.Duration
	// WriteTimeout bounds writing one answer that is not a fenced write's
	// (those have ForwardTimeout+BodyTimeout): from its first byte, so a
	// client that pipelines requests and never reads its answers does not
	// hold a connection and its goroutine for ever (default
	// DefaultWriteTimeout). The live stream's is rolling: each event has
	// this long to go out.
	WriteTimeout time.Duration
	// Registry receives the gateway's metrics and is served at /metrics.
	// Nil: a fresh registry.
	Registry *prometheus.Registry
	// OnForwarded, if set, is told of every write the upstream answered
	// (the dashboard's accepted-writes-per-token counts). It runs on the
	// write path: it must be cheap and must not block.
	OnForwarded func(resource string, token int64)
	// UI, if set, is served under /ui/ (the dashboard).
	UI http.Handler
	// Auth, if set, authenticates every call but /healthz and /readyz (API
	// keys with roles and resource prefixes), binds leases to the key that
	// acquired them and keeps the client's Authorization from the
	// upstream. Nil: no authentication.
	Auth Authenticator
	// UpstreamHeaders are added to every write forwarded to the named
	// upstream, replacing any the client sent (the upstream's credentials,
	// which workers then never hold).
	UpstreamHeaders map[string]http.Header
	// AllowedHosts are the names (host names or IP addresses; a port is
	// ignored) that requests must carry in Host, so that a browser page
	// cannot reach the gateway under a name it controls (DNS rebinding).
	// Empty or "*": any Host (an embedder's choice; cmd/fencegw sets
	// DefaultAllowedHosts or --allowed-hosts). /healthz and /readyz take any.
	// X-Forwarded-Host reaches upstreams only when the Host was checked.
	AllowedHosts []string
	// Routes bind path patterns under upstreams to the resources whose
	// leases may write there (routes.go, ParseRoute). An upstream with
	// routes refuses writes no route of it takes (403 resource_mismatch,
	// recorded); one without takes any lease.
	Routes []*Route
	// MaxStreams and MaxStreamsPerKey cap the open live rejection streams,
	// in all and per API key (defaults DefaultMaxStreams,
	// DefaultMaxStreamsPerKey): past them, 429 rate_limited.
	MaxStreams       int
	MaxStreamsPerKey int
	// Clocks receives each holder's clock offset from the Fencing-Client-Time
	// header of its acquires and renewals (share it with the dashboard).
	// Nil: one of the gateway's own.
	Clocks *tokens.Clocks
	// Rates, if set, holds the keys' request budgets shared by every
	// replica (the replicated modes' store): each request of a key with a
	// rate takes from it, within a short deadline, before its key's
	// per-replica bucket is consulted as the fallback (ratelimit.go). Nil:
	// the per-replica buckets alone, exact when there is one replica.
	Rates RateStore
	// Idempotency, if set, applies Idempotency-Key on fenced writes
	// (idempotency.go). Nil: a write with the header is refused (400),
	// never forwarded without the protection its caller asked for.
	Idempotency *tokens.Idempotency
	// Observe names the upstreams that only observe, for adopting the
	// gateway without a flag day (never the default): a write to one of
	// them under a stale, expired or released lease is forwarded, and
	// recorded as a rejection marked WouldRefuse (tokens.Write.Observe).
	// Such an upstream is NOT fenced. Unknown leases, another principal's
	// lease and route mismatches are refused as on any upstream.
	Observe map[string]bool
	// TracerProvider, if set, traces every request (tracing.go): a server
	// span continuing the client's W3C traceparent, and for fenced writes
	// admission, wait and forward spans, the forward's context sent to the
	// upstream as its traceparent. Wire TraceLockWait(TracerProvider) into
	// the Service's OnLockWait for the wait span. Nil: no tracing, at no
	// cost, and a client's traceparent reaches the upstream unchanged.
	TracerProvider trace.TracerProvider
	Logger         *slog.Logger
}

// Gateway is the HTTP face of a tokens.Service.
type Gateway struct {
	cfg       Config
	svc       *tokens.Service
	log       *slog.Logger
	metrics   *metrics
	feed      *feed
	transport *http.Transport   // the configuration of engine's connections
	engine    *engine.Transport // every fenced write's road (direct.go)
	buffers   *bufferPool       // response copy buffers of the direct forward
	proxyLog  *log.Logger       // the direct forward's messages
	// forwardVia, if set (tests only), forwards the admitted writes in
	// place of the direct forward: the reference road of the differential
	// tests, httputil.ReverseProxy (oracle_test.go).
	forwardVia func(w http.ResponseWriter, r *http.Request, f *forward)
	inflight   atomic.Int64
	ages       *inflightAges
	handler    http.Handler
	// live is what Reload replaces: upstreams, credentials, keys, hosts,
	// routes, observation (live.go). Requests load it once, in dispatch.
	live    atomic.Pointer[live]
	streams *streamSlots
	keys    *keys // nil without Config.Idempotency
	rates   *rateLimiter
	tr      *tracing // nil without Config.TracerProvider
	// stopping: the process is shutting down, and /readyz says so, so that
	// a load balancer takes the replica out before it stops serving.
	stopping atomic.Bool
}

// New builds a Gateway serving svc.
func New(svc *tokens.Service, cfg Config) *Gateway {
	if cfg.ForwardTimeout <= 0 {
		cfg.ForwardTimeout = DefaultForwardTimeout
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxControlBody <= 0 {
		cfg.MaxControlBody = DefaultMaxControlBody
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clocks == nil {
		cfg.Clocks = tokens.NewClocks()
	}
	g := &Gateway{cfg: cfg, svc: svc, log: cfg.Logger, feed: newFeed(), transport: newTransport(),
		tr: newTracing(cfg.TracerProvider)}
	g.live.Store(buildLive(Live{Upstreams: cfg.Upstreams, UpstreamHeaders: cfg.UpstreamHeaders, Auth: cfg.Auth,
		AllowedHosts: cfg.AllowedHosts, Routes: cfg.Routes, Observe: cfg.Observe}))
	g.engine = engine.New(g.transport)
	g.ages = newInflightAges(cfg.ForwardTimeout + cfg.BodyTimeout)
	g.metrics = newMetrics(cfg.Registry, svc, g.ages, func() float64 { return float64(g.inflight.Load()) })
	g.streams = newStreamSlots(cfg.MaxStreams, cfg.MaxStreamsPerKey) // streamcap.go
	now := time.Now
	if svc != nil {
		now = svc.Now
	}
	cfg.Registry.MustRegister(newClockCollector(cfg.Clocks, now))
	g.keys = newKeys(cfg.Idempotency, cfg.Registry, cfg.Logger)
	g.rates = newRateLimiter(cfg.Rates, cfg.Registry)
	g.buffers, g.proxyLog = newBufferPool(), slogErrorLog(g.log)
	si := g.controlServer(false)
	g.handler = g.framing(g.dispatch(g.routes(si), g.acquireHandler(si)))
	return g
}

// Publish sends a rejection to the live stream's subscribers. Wire the
// Service's OnRejection (or a cross-replica feed) to it.
func (g *Gateway) Publish(r tokens.Rejection) { g.feed.publish(r) }

// ServeHTTP serves the whole HTTP surface.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.handler.ServeHTTP(w, r) }

// InFlight is the number of admitted writes not yet answered.
func (g *Gateway) InFlight() int64 { return g.inflight.Load() }

// ShuttingDown turns readiness off for good: from now on /readyz answers
// 503 shutting_down while everything else is served as before. Call it
// when shutdown begins, a while (the shutdown delay) before the server stops
// accepting, so that a load balancer that health-checks /readyz stops
// sending here while the replica still answers.
func (g *Gateway) ShuttingDown() { g.stopping.Store(true) }

// Close ends live streams (so a graceful shutdown is not held up by them)
// and idle upstream connections.
func (g *Gateway) Close() {
	g.feed.close()
	g.engine.CloseIdleConnections()
}

// dispatch sends fenced writes straight to the proxy, through the same
// middleware chi would run (recoverer, then authenticate), and everything
// else to the router: chi's tree search, its route context and the path
// value it sets cost about as much as the gateway's own checks of a write
// (docs/benchmarks.md). Only requests chi would route to the proxy take the
// shortcut: a path (chi matches RawPath when set) under proxyPrefix, and a
// method chi routes (it answers others 405).
//
// POST /v1/leases, the hot control call, takes a shortcut too, to acquire:
// chi routes exactly that method and path (RawPath when set) to it.
func (g *Gateway) dispatch(router, acquire http.Handler) http.Handler {
	var proxy http.Handler = http.HandlerFunc(g.serveProxy)
	mw := g.middleware()
	for i := len(mw) - 1; i >= 0; i-- { // as chi chains r.Use: the first is outermost
		proxy = mw[i](proxy)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, _ = g.withScope(r) // the live configuration this request is judged under (live.go)
		path := r.URL.RawPath
		if path == "" {
			path = r.URL.Path
		}
		if strings.HasPrefix(path, proxyPrefix) && chiRoutes(r.Method) {
			proxy.ServeHTTP(w, r)
			return
		}
		if path != pathStream {
			w = &answerDeadline{ResponseWriter: w, d: g.cfg.WriteTimeout} // the stream's rolls (stream.go)
		}
		if path == pathLeases && r.Method == http.MethodPost {
			acquire.ServeHTTP(w, r)
			return
		}
		router.ServeHTTP(w, r)
	})
}

// allowedMethods lists the methods routes takes at req's path, for a 405's
// Allow field ("" if none).
func allowedMethods(routes chi.Routes, req *http.Request) string {
	path := req.URL.RawPath
	if path == "" {
		path = req.URL.Path
	}
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		look := m
		if m == http.MethodHead {
			look = http.MethodGet // GetHead
		}
		if routes.Match(chi.NewRouteContext(), look, path) {
			allow = append(allow, m)
		}
	}
	return strings.Join(allow, ", ")
}

// chiRoutes reports whether chi routes method (its methodMap); it answers
// any other 405.
func chiRoutes(method string) bool {
	switch method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodHead, http.MethodOptions, http.MethodConnect, http.MethodTrace, "QUERY":
		return true
	}
	return false
}

// middleware is what every request goes through before its handler, in
// order: the router uses it, and so does dispatch's shortcut for fenced
// writes, so that the two can never differ.
func (g *Gateway) middleware() []func(http.Handler) http.Handler {
	mw := []func(http.Handler) http.Handler{g.recoverer, g.browserGuard} // hosts.go
	if g.tr != nil {
		mw = append([]func(http.Handler) http.Handler{g.traceServer}, mw...) // tracing.go
	}
	// Always in the chain: a reload may turn authentication on or off.
	return append(mw, g.authenticate)
}

// routes is the router over every endpoint, the control calls served by
// si.
func (g *Gateway) routes(si server.ServerInterface) http.Handler {
	r := chi.NewRouter()
	r.Use(g.middleware()...)
	// HEAD is served wherever GET is (RFC 9110 9.1: load balancers probe
	// /healthz with it), by the GET handler: net/http's server drops the
	// body.
	r.Use(middleware.GetHead)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		p := problemOf(tokens.ErrNotFound)
		p.Detail = "no such endpoint; resource names in paths are percent-encoded (inventory%2FSKU-001)"
		sendProblem(w, r, p)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		// RFC 9110 15.5.6: a 405 lists the methods the endpoint takes.
		if allow := allowedMethods(r, req); allow != "" {
			w.Header().Set("Allow", allow)
		}
		sendProblem(w, req, problemOf(problems.ErrMethodNotAllowed))
	})

	r.HandleFunc(proxyPrefix+"*", g.serveProxy)
	r.Get(pathStream, g.serveStream)
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	r.Get("/readyz", g.serveReady)
	r.Get("/v1", g.serveIndex)
	r.Get(pathIndex, g.serveIndex)
	r.Get(pathSpecYAML, g.serveSpecYAML)
	r.Get(pathSpecJSON, g.serveSpecJSON)
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(g.cfg.Registry, promhttp.HandlerOpts{Registry: g.cfg.Registry}))
	if g.cfg.UI != nil {
		r.Handle("/ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
		r.Handle("/ui/*", g.cfg.UI)
		r.Get("/", http.RedirectHandler("/ui/", http.StatusFound).ServeHTTP)
	}

	server.HandlerWithOptions(si, server.ChiServerOptions{
		BaseRouter:       r,
		Middlewares:      []server.MiddlewareFunc{g.controlBody},
		ErrorHandlerFunc: g.paramErrorHandler,
	})
	return r
}

// controlServer is the generated strict server over the control handlers,
// with POST /v1/leases decoded and answered by hand (acquire.go) unless
// generatedOnly.
func (g *Gateway) controlServer(generatedOnly bool) server.ServerInterface {
	ctl := &control{svc: g.svc, metrics: g.metrics, clocks: g.cfg.Clocks, tracing: g.tr != nil}
	strict := server.NewStrictHandlerWithOptions(ctl, nil, server.StrictHTTPServerOptions{
		RequestErrorHandlerFunc: g.requestErrorHandler,
		ResponseErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			writeProblem(w, r, g.log, err)
		},
	})
	if generatedOnly {
		return strict
	}
	return &fastAcquire{ServerInterface: strict, ctl: ctl, g: g}
}

// acquireHandler is POST /v1/leases as the router serves it (the same
// middleware, the generated wrapper's header parameters and controlBody),
// for dispatch to call without the router's tree search and route context.
func (g *Gateway) acquireHandler(si server.ServerInterface) http.Handler {
	wrapper := &server.ServerInterfaceWrapper{Handler: si, HandlerMiddlewares: []server.MiddlewareFunc{g.controlBody}, ErrorHandlerFunc: g.paramErrorHandler}
	var h http.Handler = http.HandlerFunc(wrapper.AcquireLease)
	mw := g.middleware()
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

func (g *Gateway) serveReady(w http.ResponseWriter, r *http.Request) {
	if g.stopping.Load() {
		p := problemOf(problems.ErrShuttingDown)
		p.Detail = "this replica is shutting down: it still serves requests for its shutdown delay, but takes no new ones after it; send them to another replica"
		sendProblem(w, r, p)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := g.svc.Ping(ctx); err != nil {
		writeProblem(w, r, g.log, tokens.Unavailable("ping", err))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ready\n")
}

// recoverer turns a panic into a 500 problem (the gateway never dies of
// input), except http.ErrAbortHandler, which net/http handles itself.
func (g *Gateway) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				g.log.Error("panic serving request", "method", r.Method, "path", logPath(r), "panic", v)
				sendProblem(w, r, problemOf(problems.ErrInternal))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// slogErrorLog routes the direct forward's own messages (worded as
// httputil.ReverseProxy's) to slog, with lease ids cut to their hints
// (its errors may name the outbound URL, whose path the client chose).
func slogErrorLog(l *slog.Logger) *log.Logger {
	return log.New(redactingWriter{l}, "", 0)
}

type redactingWriter struct{ l *slog.Logger }

func (w redactingWriter) Write(p []byte) (int, error) {
	w.l.Warn(tokens.RedactLeaseIDs(strings.TrimSuffix(string(p), "\n")))
	return len(p), nil
}

// pathStream is the live rejection stream's.
const pathStream = "/v1/rejections/stream"

// answerDeadline sets a write deadline d ahead when its answer starts
// (Config.WriteTimeout): not when the request comes, since a call may wait
// (an acquire's wait_ms) before it answers. Net/http lifts the deadline
// once the answer is done.
type answerDeadline struct {
	http.ResponseWriter
	d   time.Duration
	set bool
}

func (w *answerDeadline) start() {
	if !w.set {
		w.set = true
		_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Now().Add(w.d))
	}
}

func (w *answerDeadline) WriteHeader(code int) {
	w.start()
	w.ResponseWriter.WriteHeader(code)
}

func (w *answerDeadline) Write(p []byte) (int, error) {
	w.start()
	return w.ResponseWriter.Write(p)
}

// Flush: promhttp and the dashboard flush through the interface.
func (w *answerDeadline) Flush() {
	w.start()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController (flushes, deadlines) reach the
// connection's writer.
func (w *answerDeadline) Unwrap() http.ResponseWriter { return w.ResponseWriter }
