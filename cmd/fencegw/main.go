// Command fencegw is the fencing gateway: workers get leases and fencing
// tokens from it and send their writes through it; stale writes get 409
// before they reach the protected upstream.
//
//	fencegw                  serve on 127.0.0.1:8080 with ./fencegw-data
//	fencegw serve [flags]    see `fencegw help`
//	fencegw demo             replay the incident without and with the gateway
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegw/fencegw/auth"
	"github.com/fencegw/fencegw/internal/gcheadroom"
	"github.com/fencegw/fencegw/replica"
)

func main() {
	ctx, hurry := shutdownSignals()
	code := run(ctx, hurry, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	os.Exit(code)
}

// shutdownSignals returns a context cancelled by the first SIGTERM or
// SIGINT (shutdown begins: readiness off, then the shutdown delay) and a
// channel closed by the second (the delay is cut short, the drain goes on).
// After the second, the signals get Go's default handling back, so a third
// ends the process at once, as an operator pressing Ctrl-C thrice means.
func shutdownSignals() (context.Context, <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	hurry := make(chan struct{})
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		cancel()
		<-sigs
		close(hurry)
		signal.Reset(os.Interrupt, syscall.SIGTERM)
	}()
	return ctx, hurry
}

// run is the whole program, testable in-process: exit code 0 after a clean
// shutdown, 2 for bad flags or config, 1 for anything else. Cancelling ctx
// starts a shutdown; closing hurry cuts its delay short.
func run(ctx context.Context, hurry <-chan struct{}, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	} else if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		cmd, args = "version", args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		var cfg config
		if cfg, err = parseServe(args, getenv); err == nil {
			cfg.reparse = func() (config, error) { return parseServe(args, getenv) }
			err = serve(ctx, hurry, cfg, stdout, nil)
		}
	case "config":
		err = configCheck(args, getenv, stdout)
	case "demo":
		err = runDemo(ctx, args, stdout, stderr)
	case "hash-key":
		err = hashKey(os.Stdin, stdout)
	case "gen-key":
		key := auth.GenerateKey()
		fmt.Fprintf(stdout, "key:    %s\nsha256: %s\n", key, auth.Hash(key))
	case "version":
		if len(args) > 0 {
			err = usageError("version takes no arguments")
			break
		}
		fmt.Fprintln(stdout, versionLine())
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		err = usageError("unknown command %q (want serve, config, demo, gen-key, hash-key or version)", cmd)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errHelp):
		fmt.Fprintln(stdout, usage)
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "fencegw: "+strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
		return 2
	default:
		fmt.Fprintln(stderr, "fencegw: "+err.Error())
		return 1
	}
}

const usage = `fencegw — an HTTP fencing gateway

usage:
  fencegw                      serve on 127.0.0.1:8080 with the embedded store in ./fencegw-data
  fencegw demo [--listen ADDR] [--exit]  replay the stale-write incident without and with the gateway
  fencegw gen-key              print a new API key and its sha256 for --auth-file
  fencegw hash-key < KEY       print the sha256 of a key read on stdin
  fencegw config check FILE    read a --config file (and the files it names) as serve would, without serving
  fencegw version              print the build: version, commit, Go version
  fencegw serve [flags]
      --config FILE            YAML: every flag a key of the same name (forward-timeout: 30s), a repeatable flag a
                               list (upstream: [statements=http://10.0.0.5:8080]); flags and FENCEGW_* override it.
                               SIGHUP or a replaced file reloads upstreams, routes, --observe, --allowed-hosts,
                               --auth-file and the TLS certificate in place
      --listen ADDR            address to serve on (127.0.0.1:8080)
      --data DIR               embedded store directory (fencegw-data)
      --upstream NAME=URL      a protected upstream (repeatable)
      --postgres URL           tokens, fences, leases, rejections in PostgreSQL
      --redis URL              leases in Redis (needs --postgres)
      --forward-timeout D      bound on one forward (30s)
      --drain-period D         grants wait this long after a forward with unknown outcome (= forward timeout)
      --grant-wait D           how long a grant waits for in-flight writes (10s)
      --max-body SIZE          largest fenced write body (10MiB)
      --body-timeout D         bound on reading one request body; slow clients are cut off (30s)
      --shutdown-delay D       on SIGTERM, /readyz fails at once and the replica serves on this long before it stops
                               accepting: your load balancer's check interval x fall count + margin (5s); a second
                               signal cuts it short
      --auth-file PATH         API keys (sha256, role, resource prefixes, rate, caps) and upstream credentials
      --insecure-no-auth       allow a non-loopback --listen without --auth-file
      --tls-cert FILE          serve HTTPS (with --tls-key FILE)
      --observe NAME           upstream NAME only observes (repeatable; adoption, never the default): writes under
                               stale, expired or released leases are forwarded and recorded as would_refuse; NOT fenced
      --route U/PATTERN=RES    only leases of RES may write to PATTERN under upstream U (repeatable), like
                               statements/accounts/{acct}/**=stmt:acct:{acct}; a bound upstream refuses the rest
      --allowed-hosts NAMES    names clients use (comma-separated; '*': any); other Host headers get 403
                               (default: loopback names and the --listen address on a loopback listen, else off)
      --log-level LEVEL        debug, info, warn, error (info)
      --pg-max-conns N         PostgreSQL query pool (16)
      --pg-lock-conns N        PostgreSQL connections for grants, releases, revokes holding or waiting for a lock (8)
      --pg-schema NAME         PostgreSQL schema for fencegw's tables, created if missing (the URL's search_path)
      --redis-prefix P         start of every Redis key and channel (fencegw: in the default schema,
                               fencegw:<schema># with --pg-schema: deployments in two schemas share nothing in Redis)
      --pg-fence-sessions N    PostgreSQL sessions holding this replica's shared fences across writes (4)
      --pg-max-fences N        most resources this replica keeps fenced, one advisory lock each (4096)
      --pg-session-check D     stop admitting writes when the lock session was not confirmed for this long;
                               a dead replica's resources drain for --drain-period plus this (1s)
      --pg-statement-timeout D PostgreSQL statement_timeout (5s)
      --pg-lock-timeout D      bound on an advisory lock wait (30s)
      --idempotency-window D   how long an Idempotency-Key's record is kept (24h)
      --idempotency-max-body SIZE  largest answer body kept for replay (64KiB)
      --idempotency-max-records N  most Idempotency-Key records kept; the oldest go first (100000)
      --gc-headroom SIZE       memory garbage may take above twice the live heap before Go's collector runs
                               (32MiB, at most an eighth of a memory limit; 0: Go's default; GOGC set: GOGC's)
  Every flag can come from the environment as FENCEGW_<FLAG>; FENCEGW_UPSTREAMS, FENCEGW_ROUTES and
  FENCEGW_OBSERVES take comma-separated lists.`

var errHelp = errors.New("help requested")

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// serve builds the replica the configuration describes (replica.New),
// prints what it serves, and runs it until ctx is cancelled, then shuts
// down as a load balancer never notices (replica.Shutdown): /readyz fails at once, everything else is served
// for cfg.ShutdownDelay (or until hurry is closed), then the listener
// closes, in-flight requests are answered with Connection: close, writes
// drain and the store (with its fences) closes. ready, if not nil,
// receives the bound address.
func serve(ctx context.Context, hurry <-chan struct{}, cfg config, stdout io.Writer, ready chan<- string) error {
	level, _ := parseLevel(cfg.LogLevel)
	logger := slog.New(slog.NewTextHandler(stdout, &slog.HandlerOptions{Level: level}))
	if cfg.DrainPeriod < cfg.ForwardTimeout {
		// Guarantee 1 then rests on the upstream: a write that timed out at
		// the forward timeout may land after the drain that its timeout
		// started has ended (docs/operations.md, "How the flags must relate").
		logger.Warn("--drain-period is shorter than --forward-timeout: a write whose outcome is unknown may land after the next holder's",
			"drain_period", cfg.DrainPeriod, "forward_timeout", cfg.ForwardTimeout)
	}

	// The collector's headroom is the process's: one replica per process.
	defer gcheadroom.Start(cfg.GCHeadroom)()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Tracing's shutdown runs after the replica's (deferred before it), so
	// that the spans of the writes drained at shutdown are flushed too.
	var tp trace.TracerProvider
	if cfg.Tracing {
		var shutdown func(context.Context) error
		var err error
		if tp, shutdown, err = startTracing(ctx); err != nil {
			return err
		}
		defer func() {
			if err := shutdown(context.WithoutCancel(ctx)); err != nil {
				logger.Warn("could not flush the last traces", "err", err)
			}
		}()
	}

	scheme := "http"
	var tlsConfig *tls.Config
	rl := &reloader{log: logger, cur: cfg, seen: fileIdentities(cfg)} // reload.go
	if cfg.Cert != nil {
		// Each handshake takes the certificate in use, which a reload
		// replaces (cert-manager renews them every 60 days or so).
		rl.cert = new(atomic.Pointer[tls.Certificate])
		rl.cert.Store(cfg.Cert)
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return rl.cert.Load(), nil
		}}
		scheme = "https"
	}
	r, err := replica.New(ctx, replica.Config{
		Mode:               modeConfig(cfg),
		Listen:             cfg.Listen,
		TLS:                tlsConfig,
		Live:               liveOf(cfg), // reload.go
		ForwardTimeout:     cfg.ForwardTimeout,
		BodyTimeout:        cfg.BodyTimeout,
		MaxBody:            cfg.MaxBody,
		GrantWait:          cfg.GrantWait,
		IdempotencyWindow:  cfg.IdempotencyWindow,
		IdempotencyMaxBody: int(cfg.IdempotencyMaxBody),
		ShutdownDelay:      cfg.ShutdownDelay,
		Logger:             logger,
		Registry:           reg,
		TracerProvider:     tp,
	})
	if err != nil {
		return storeError(err, cfg) // storage.go
	}
	defer r.Close()
	rl.gw = r.Gateway()
	addr := r.Addr()
	fmt.Fprintf(stdout, "fencegw %s mode, serving on %s://%s\n  API:       %s://%s/v1/\n  dashboard: %s://%s/ui/\n  metrics:   %s://%s/metrics\n",
		r.ModeName(), scheme, addr, scheme, addr, scheme, addr, scheme, addr)
	if cfg.Auth != nil {
		fmt.Fprintf(stdout, "  authentication: %d API keys from %s\n", cfg.Auth.Keys.Len(), cfg.AuthFile)
	} else {
		fmt.Fprintln(stdout, "  authentication: off (no --auth-file)")
	}
	switch {
	case cfg.AllowedHosts != nil:
		fmt.Fprintf(stdout, "  Host check: %s\n", strings.Join(cfg.AllowedHosts, ", "))
	case slices.Contains(cfg.HostsFlag, "*"):
		fmt.Fprintln(stdout, "  Host check: off (--allowed-hosts '*')")
	default:
		fmt.Fprintf(stdout, "  Host check: off: --listen %s is not a loopback address and there is no --allowed-hosts; set it to the names clients use, so that a browser page cannot reach the gateway under a name it controls (DNS rebinding)\n", cfg.Listen)
	}
	if cfg.Tracing {
		fmt.Fprintln(stdout, "  tracing: OpenTelemetry, OTLP over HTTP (the OTEL_* variables)")
	}
	if len(cfg.Upstreams) == 0 {
		fmt.Fprintln(stdout, "  no upstreams configured: add --upstream NAME=URL to forward fenced writes")
	}
	for name, u := range cfg.Upstreams {
		fmt.Fprintf(stdout, "  upstream %s -> %s (fenced writes: %s://%s/v1/proxy/%s/...)\n", name, u, scheme, addr, name)
		if cfg.Observe[name] {
			fmt.Fprintf(stdout, "    OBSERVE ONLY, NOT FENCED: writes under stale, expired or released leases are forwarded and recorded as would_refuse (drop --observe %s to enforce)\n", name)
		}
		bound := false
		for _, r := range cfg.Routes {
			if r.Upstream() == name {
				fmt.Fprintf(stdout, "    route %s\n", r)
				bound = true
			}
		}
		if !bound {
			fmt.Fprintln(stdout, "    any live lease may write here (no --route binds it to resources)")
		}
	}
	if ready != nil {
		ready <- addr
	}

	// Reloads apply until serve returns: the replica serves on through
	// the shutdown delay.
	life, endLife := context.WithCancel(context.WithoutCancel(ctx))
	defer endLife()
	go rl.run(life)
	return r.Run(ctx, hurry) // replica.Shutdown: the drain, in order
}

// hashKey prints the sha256 of the key on stdin's first line, for --auth-file.
func hashKey(stdin io.Reader, stdout io.Writer) error {
	line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
	if err != nil && err != io.EOF {
		return err
	}
	key := strings.TrimRight(line, "\r\n")
	if key == "" {
		return usageError("hash-key reads a key on stdin (fencegw gen-key makes one)")
	}
	fmt.Fprintln(stdout, auth.Hash(key))
	return nil
}
