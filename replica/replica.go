// Package replica builds and runs one fencegw replica: the storage mode
// (storage/mode), the tokens.Service on it, the Idempotency-Key records,
// the persisted write counts, the holders' clocks, the gateway with its
// dashboard and live feed, and the HTTP server on the gateway's own
// listener (framing scan, TLS). fencegw serve, its demo, the load tool and
// the end-to-end tests all build a replica here and differ only in the
// Config they pass, so that what is tested and measured is what runs.
package replica

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/tokens"
	"github.com/fencegw/fencegw/web"
)

// Config is everything one replica is built from. Zero values take the
// defaults of the package that owns the setting.
type Config struct {
	// Mode is the storage mode to open. Its DrainPeriod is the Service's
	// too (tokens.DefaultDrainPeriod if zero), and Logger is set from
	// Logger below when empty.
	Mode mode.Config
	// Listen is the address to serve on (host:port; port 0: any free one).
	Listen string
	// TLS, if set, terminates TLS on the gateway's listener (its
	// GetCertificate may hand out a certificate a reload replaced).
	TLS *tls.Config

	// Live is the gateway's first live configuration (upstreams, their
	// credentials, API keys, allowed hosts, routes, observed upstreams);
	// Gateway().Reload replaces it.
	Live gateway.Live
	// ForwardTimeout, BodyTimeout and MaxBody are the gateway's
	// (gateway.Config); GrantWait is the Service's.
	ForwardTimeout, BodyTimeout time.Duration
	MaxBody                     int64
	GrantWait                   time.Duration
	// IdempotencyWindow and IdempotencyMaxBody are the Idempotency-Key
	// records' (tokens.IdempotencyConfig); their number is bounded by
	// Mode.IdempotencyMaxRecords.
	IdempotencyWindow  time.Duration
	IdempotencyMaxBody int
	// ShutdownDelay is how long Run serves on, /readyz failing, after its
	// context ends and before the listener closes.
	ShutdownDelay time.Duration

	Logger *slog.Logger // nil: discarded
	// Registry receives the process's, the store's and the gateway's
	// metrics and is served at /metrics. Nil: a fresh one.
	Registry       *prometheus.Registry
	TracerProvider trace.TracerProvider // nil: no tracing

	// WrapExcluder, if set, wraps the exclusive side of the mode's lock
	// (its Locker's, or in the PostgreSQL modes its Fencer's) before the
	// Service gets it: tests watch grants, releases and revokes take it.
	// Production leaves it nil.
	WrapExcluder func(tokens.Excluder) tokens.Excluder
}

// Replica is one replica built and listening; Start or Run serves it.
type Replica struct {
	cfg        Config
	log        *slog.Logger
	mode       *mode.Mode
	svc        *tokens.Service
	keys       *tokens.Idempotency
	gw         *gateway.Gateway
	srv        *http.Server
	ln         gateway.ServingListener
	endFeed    context.CancelFunc
	stopCounts func()
	served     chan error // nil until Start
	closeOnce  sync.Once
}

// New opens the storage mode cfg names, builds the replica on it and
// binds its listener; nothing is served until Start or Run. The mode's
// errors come as storage/mode returns them (*mode.ConfigError,
// *mode.StoreError), for the caller to word.
func New(ctx context.Context, cfg Config) (_ *Replica, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Mode.Logger == nil {
		cfg.Mode.Logger = cfg.Logger
	}
	if cfg.Mode.DrainPeriod <= 0 {
		cfg.Mode.DrainPeriod = tokens.DefaultDrainPeriod
	}
	if cfg.ForwardTimeout <= 0 {
		cfg.ForwardTimeout = gateway.DefaultForwardTimeout
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	log := cfg.Logger
	r := &Replica{cfg: cfg, log: log, stopCounts: func() {}, endFeed: func() {}}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()

	if r.mode, err = mode.Open(ctx, cfg.Mode); err != nil {
		return nil, err
	}
	for _, c := range r.mode.Collectors {
		if err := cfg.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("register the store's metrics: %w", err)
		}
	}
	locker, fencer := r.mode.Locker, r.mode.Fencer
	if w := cfg.WrapExcluder; w != nil {
		if locker != nil {
			locker = wrappedLocker{locker, w(locker)}
		}
		if fencer != nil {
			fencer = wrappedFencer{fencer, w(fencer)}
		}
	}
	// Accepted-write counts: counted in memory on the write path, added to
	// the store once a second (every storage mode keeps them), so the
	// dashboard shows every replica's and survives restarts.
	counts := web.NewCounts()
	var gw *gateway.Gateway // set below, before anything can be rejected
	r.svc = tokens.New(tokens.Config{
		Store:       r.mode.Store,
		Locker:      locker,
		Fencer:      fencer,
		GrantWait:   cfg.GrantWait,
		DrainPeriod: cfg.Mode.DrainPeriod,
		Logger:      log,
		OnRejection: r.mode.Feed.Publish,
		OnLockWait:  gateway.TraceLockWait(cfg.TracerProvider),
	})
	r.mode.OnFree(r.svc.Wake)
	if wc, ok := r.mode.Store.(tokens.WriteCounter); ok {
		r.stopCounts = counts.Persist(wc, time.Second, log)
	}
	// Holders' clock offsets (Fencing-Client-Time): exported as a metric
	// by the gateway, shown next to the holder by the dashboard.
	clocks := tokens.NewClocks()
	r.keys = tokens.NewIdempotency(tokens.IdempotencyConfig{
		Store:   r.mode.Keys,
		Window:  cfg.IdempotencyWindow,
		MaxBody: cfg.IdempotencyMaxBody,
		// A keyed write's body is read before its key is begun, so its
		// record is in progress for the forward and the store call that
		// records its answer (a second, then in the background) at most.
		InFlight: cfg.ForwardTimeout + 5*time.Second,
		Logger:   log,
	})
	live := cfg.Live
	gw = gateway.New(r.svc, gateway.Config{
		Upstreams:       live.Upstreams,
		UpstreamHeaders: live.UpstreamHeaders,
		Auth:            live.Auth,
		AllowedHosts:    live.AllowedHosts,
		Routes:          live.Routes,
		Observe:         live.Observe,
		Clocks:          clocks,
		Rates:           r.mode.Rates,
		ForwardTimeout:  cfg.ForwardTimeout,
		MaxBody:         cfg.MaxBody,
		BodyTimeout:     cfg.BodyTimeout,
		Registry:        cfg.Registry,
		OnForwarded:     counts.Accepted,
		UI:              web.Handler(r.svc, counts, web.WithClocks(clocks)),
		TracerProvider:  cfg.TracerProvider,
		Logger:          log,
		Idempotency:     r.keys,
	})
	r.gw = gw
	// The live feed lasts as long as the replica, not until Run's context
	// ends: the replica serves on through the shutdown delay.
	feedCtx, endFeed := context.WithCancel(context.WithoutCancel(ctx))
	r.endFeed = endFeed
	if err := r.mode.Feed.Subscribe(feedCtx, func(rej tokens.Rejection) {
		counts.Rejected(rej)
		gw.Publish(rej)
	}); err != nil {
		return nil, fmt.Errorf("subscribe to the live feed: %w", err)
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	r.srv = &http.Server{
		Handler:           gw,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	// No ReadTimeout or WriteTimeout: they would also end live streams and
	// long forwards; the gateway bounds each body read and each fenced
	// write's answer itself (BodyTimeout, ForwardTimeout).
	//
	// The gateway's listener sees each request's header block as sent, so
	// that requests with both Content-Length and Transfer-Encoding are
	// refused; it terminates TLS itself for that and serves HTTP/1.1 only.
	r.ln = gateway.Listener(r.srv, ln, cfg.TLS)
	return r, nil
}

// Addr is the address the replica listens on (the port chosen, for a
// Listen port of 0).
func (r *Replica) Addr() string { return r.ln.Addr().String() }

// URL is the replica's base URL: http://ADDR, or https:// with TLS.
func (r *Replica) URL() string {
	if r.cfg.TLS != nil {
		return "https://" + r.Addr()
	}
	return "http://" + r.Addr()
}

// ModeName is the storage mode's name for the start banner
// ("embedded (path)", "postgres", "postgres+redis").
func (r *Replica) ModeName() string { return r.mode.Name }

// Gateway is the replica's gateway: for a reload (Reload, Generation)
// and for tests that read its state.
func (r *Replica) Gateway() *gateway.Gateway { return r.gw }

// Service is the replica's tokens.Service: for tests and tools that act
// on leases without HTTP.
func (r *Replica) Service() *tokens.Service { return r.svc }

// Mode is the storage mode the replica runs on: for tests and the load
// tool that look into the store itself.
func (r *Replica) Mode() *mode.Mode { return r.mode }

// Start serves in the background until Shutdown or Close.
func (r *Replica) Start() {
	if r.served != nil {
		return
	}
	r.served = make(chan error, 1)
	go func() { r.served <- r.srv.Serve(r.ln) }()
}

// Run serves until ctx ends or serving fails, then shuts down (Shutdown).
func (r *Replica) Run(ctx context.Context, hurry <-chan struct{}) error {
	r.Start()
	select {
	case err := <-r.served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	return r.Shutdown(hurry)
}

// Shutdown stops the replica as a load balancer never notices: /readyz
// fails at once, everything else is served for Config.ShutdownDelay (or
// until hurry is closed), then the listener closes, in-flight requests
// are answered with Connection: close, writes drain and the records they
// left are taken by the store. Close then closes the store.
//
// Requests still running after the forward timeout and 5 s are cut short
// (cut) and the drain and records waits run all the same; Shutdown then
// returns the timeout's error. Every wait is bounded.
func (r *Replica) Shutdown(hurry <-chan struct{}) error {
	r.Start() // a replica never served shuts down the same way
	cfg, logger, gw, svc := r.cfg, r.log, r.gw, r.svc
	// Keep-alive connections stay open during the delay: closing an idle
	// one races with a load balancer that still counts the replica as up
	// and is sending a request on it, which then reads EOF.
	gw.ShuttingDown()
	if cfg.ShutdownDelay > 0 {
		logger.Info("shutting down: /readyz answers 503, serving on for the shutdown delay (signal again to cut it short)",
			"shutdown_delay", cfg.ShutdownDelay)
		delay := time.NewTimer(cfg.ShutdownDelay)
		select {
		case <-delay.C:
		case <-hurry:
			logger.Info("shutting down: the shutdown delay was cut short by a second signal")
		case err := <-r.served:
			delay.Stop()
			return fmt.Errorf("serve: %w", err)
		}
		delay.Stop()
	}
	logger.Info("shutting down: draining in-flight writes", "in_flight", gw.InFlight())
	// Answers from now on say Connection: close, so that clients and load
	// balancers do not send another request on a connection about to close.
	r.srv.SetKeepAlivesEnabled(false)
	gw.Close() // end live streams, which would otherwise hold Shutdown up
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ForwardTimeout+5*time.Second)
	defer cancel()
	// The fenced writes the listener's own loop serves are not Go's
	// server's to wait for: its own Shutdown waits for them.
	stopErr := r.srv.Shutdown(shutdownCtx)
	if stopErr == nil {
		stopErr = r.ln.Shutdown(shutdownCtx)
	}
	if stopErr != nil {
		// Requests still running: cut them short, and let their handlers
		// end (a write cut mid-forward starts its drain) before the waits
		// below, which a timed-out stop needs as much as a clean one.
		r.cut(stopErr)
	}
	// Drains the store could not record yet hold their fences until it
	// does or they pass; each passes within a drain period, so this wait
	// never gives one up early (tokens.Service.WaitDrains).
	if n := svc.Draining(); n > 0 {
		logger.Warn("shutting down: waiting for drain periods the store has not recorded yet", "drains", n)
		drainCtx, cancel := context.WithTimeout(context.Background(), cfg.Mode.DrainPeriod+time.Second)
		err := svc.WaitDrains(drainCtx)
		cancel()
		if err != nil {
			logger.Error("shutting down with drains unrecorded", "drains", svc.Draining(), "err", err)
		}
	}
	// Records the answers did not wait for (a rejection's entry, the end of
	// a keyed write) are finished before the store closes: each is given up
	// within its own bound (a rejection's 5 s, a key's in-flight time), so
	// this wait is bounded too. (Closing first would turn a PostgreSQL
	// key still in progress unknown, and lose the answer being recorded.)
	if n, k := svc.Recording(), r.keys.Pending(); n > 0 || k > 0 {
		logger.Warn("shutting down: waiting for records the store has not taken yet", "rejections", n, "idempotency_keys", k)
		recCtx, cancel := context.WithTimeout(context.Background(), cfg.ForwardTimeout+6*time.Second)
		err := errors.Join(svc.WaitRecords(recCtx), r.keys.Wait(recCtx))
		cancel()
		if err != nil {
			logger.Error("shutting down with records not taken by the store", "rejections", svc.Recording(), "idempotency_keys", r.keys.Pending(), "err", err)
		}
	}
	if stopErr != nil {
		return fmt.Errorf("shutdown: %w", stopErr)
	}
	logger.Info("stopped")
	return nil
}

// cutWait bounds how long a shutdown that ran out of time waits, once it
// closed the remaining connections, for the handlers they served to
// return. A handler whose connection is closed sees its body's read fail
// within the listener's lingering close (half a second) and its answer's
// write at once; only a forward already under way, bounded by its own
// timeout, goes on.
const cutWait = 5 * time.Second

// cut ends the requests a graceful stop could not wait for (cause: its
// error): every connection is closed, busy ones too, by Go's server
// (http.Server.Close) and by the listener's own loop (Abort), and cut waits,
// at most cutWait, for their handlers: the own loop's (its Shutdown) and
// Go's server's admitted writes (Gateway.InFlight). A fenced write whose
// body or answer is cut short after its request left for the upstream
// ends with an unknown outcome, which starts its drain (tokens.Permit.Done);
// one cut before any of it left releases its fence, nothing forwarded.
func (r *Replica) cut(cause error) {
	r.log.Error("shutting down: requests still running at the shutdown timeout; closing their connections",
		"in_flight", r.gw.InFlight(), "err", cause)
	_ = r.srv.Close()
	r.ln.Abort()
	ctx, cancel := context.WithTimeout(context.Background(), cutWait)
	defer cancel()
	err := r.ln.Shutdown(ctx)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for err == nil && r.gw.InFlight() > 0 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err != nil {
		r.log.Error("shutting down with writes still in flight; their resources drain as after a crash",
			"in_flight", r.gw.InFlight(), "err", err)
	}
}

// Close stops the replica at once (connections closed, not drained; after
// Shutdown nothing is left to drain) and closes its store: the counts'
// last flush first, the feed, then the mode (feed, fence, stores). It is
// safe to call more than once.
func (r *Replica) Close() {
	r.closeOnce.Do(func() {
		if r.srv != nil {
			_ = r.srv.Close()
		}
		if r.ln != nil {
			// A listener never served, and the own loop's busy
			// connections, which the server's Close does not reach.
			r.ln.Abort()
		}
		if r.gw != nil {
			r.gw.Close()
		}
		r.endFeed()
		r.stopCounts() // after the drain, before the store closes
		if r.mode != nil {
			r.mode.Close()
		}
	})
}
