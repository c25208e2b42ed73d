package main

// The configuration of `fencegw serve`: its flags, environment variables and
// --config file, and their checks.

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencegw/fencegw/auth"
	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/internal/gcheadroom"
	"github.com/fencegw/fencegw/tokens"
)

// config is everything `fencegw serve` can be told.
type config struct {
	// ConfigFile is --config: YAML, every flag a key (configfile.go).
	ConfigFile     string
	Listen         string
	Data           string
	Upstreams      map[string]*url.URL
	Postgres       string
	Redis          string
	ForwardTimeout time.Duration
	DrainPeriod    time.Duration
	GrantWait      time.Duration
	MaxBody        int64
	LogLevel       string
	BodyTimeout    time.Duration
	// ShutdownDelay is how long a replica told to stop goes on serving
	// with /readyz failing, so that a load balancer takes it out first.
	ShutdownDelay time.Duration

	// AuthFile is --auth-file; Auth its loaded contents (nil: no
	// authentication). InsecureNoAuth allows a non-loopback listener
	// without it.
	AuthFile       string
	Auth           *auth.Config
	InsecureNoAuth bool
	TLSCert        string
	TLSKey         string
	// Cert is the loaded --tls-cert and --tls-key (nil without TLS).
	Cert *tls.Certificate
	// AllowedHosts is the Host allow-list handed to the gateway (nil: no
	// check, said at start); HostsFlag is --allowed-hosts as given.
	AllowedHosts []string
	HostsFlag    []string
	// Routes bind path patterns under upstreams to resources (--route).
	Routes []*gateway.Route
	// Observe names the upstreams that only observe (--observe): not
	// fenced, what would be refused is recorded as would_refuse.
	Observe map[string]bool

	PGMaxConns         int32
	PGLockConns        int32
	PGStatementTimeout time.Duration
	PGLockTimeout      time.Duration
	PGFenceSessions    int
	PGSchema           string
	RedisPrefix        string
	PGMaxFences        int
	PGSessionCheck     time.Duration

	// Idempotency-Key records (docs/idempotency.md).
	IdempotencyWindow     time.Duration
	IdempotencyMaxBody    int64
	IdempotencyMaxRecords int

	// GCHeadroom is the garbage collector's headroom above the live heap
	// (internal/gcheadroom; 0: Go's default, as is GOGC set).
	GCHeadroom int64

	// Tracing: the OTEL_* variables ask for OpenTelemetry traces
	// (tracing.go); the SDK reads the rest of them itself.
	Tracing bool

	// src says where each flag's value came from, for messages.
	src sources

	// reparse reads the configuration again as it was read at start (the
	// same flags and environment, the files as they are now): a reload.
	reparse func() (config, error)
}

// defaultShutdownDelay covers a few health-check intervals of a load
// balancer that checks every second or two and takes a replica out after
// one or two failures (docs/operations.md, "Rolling restarts").
const defaultShutdownDelay = 5 * time.Second

// errUsage marks a bad flag or config value: exit code 2.
var errUsage = errors.New("usage")

func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

// observeList is a repeatable --observe NAME.
type observeList struct{ names []string }

func (o *observeList) String() string { return "" }

func (o *observeList) Set(v string) error {
	if v = strings.TrimSpace(v); v == "" {
		return errors.New("an upstream name is required")
	}
	o.names = append(o.names, v)
	return nil
}

// upstreamList is a repeatable --upstream NAME=URL.
type upstreamList struct{ m map[string]*url.URL }

func (u *upstreamList) String() string { return "" }

func (u *upstreamList) Set(v string) error {
	name, raw, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return errors.New("want NAME=URL")
	}
	if strings.ContainsAny(name, "/?#% ") {
		return fmt.Errorf("upstream name %q may not contain / ? # %% or spaces", name)
	}
	target, err := url.Parse(raw)
	if err != nil || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
		if err == nil {
			raw = target.Redacted() // the line may go to a log: no password in it
		}
		return fmt.Errorf("upstream %q: %q is not an http(s) URL", name, raw)
	}
	if target.RawQuery != "" || target.Fragment != "" {
		return fmt.Errorf("upstream %q: the base URL may not have a query or fragment", name)
	}
	if target.User != nil {
		// Neither the engine nor the reverse proxy sends a URL's user
		// information: it would be dropped in silence (and the start
		// banner would print the password).
		return fmt.Errorf("upstream %q: the base URL may not hold credentials (user:password@); the gateway sends an upstream's own credentials from the auth file's upstreams (headers: {Authorization: ...}), docs/security.md", name)
	}
	if _, dup := u.m[name]; dup {
		return fmt.Errorf("upstream %q given twice", name)
	}
	u.m[name] = target
	return nil
}

// hostNames is --allowed-hosts: comma-separated host names or IP
// addresses (a port is ignored), repeatable; "*" turns the check off.
type hostNames struct{ list *[]string }

func (h hostNames) String() string {
	if h.list == nil {
		return ""
	}
	return strings.Join(*h.list, ",")
}

func (h hostNames) Set(v string) error {
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		switch {
		case item == "":
			continue
		case item != "*" && (strings.ContainsAny(item, "/?#@ \t%*") || len(item) > 253):
			return fmt.Errorf("%q is not a host name or address", item)
		}
		*h.list = append(*h.list, item)
	}
	return nil
}

// routeList is a repeatable --route UPSTREAM/PATTERN=RESOURCE.
type routeList struct{ list *[]*gateway.Route }

func (l routeList) String() string { return "" }

func (l routeList) Set(v string) error {
	r, err := gateway.ParseRoute(v)
	if err != nil {
		return err
	}
	*l.list = append(*l.list, r)
	return nil
}

// byteSize parses sizes like 10MiB, 512KiB, 1048576.
type byteSize struct{ n *int64 }

func (b byteSize) String() string {
	if b.n == nil {
		return ""
	}
	return strconv.FormatInt(*b.n, 10)
}

func (b byteSize) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*b.n = n
	return nil
}

// byteSizeOrOff is a byteSize that may also be 0: off.
type byteSizeOrOff struct{ byteSize }

func (b byteSizeOrOff) Set(v string) error {
	if strings.TrimSpace(v) == "0" {
		*b.n = 0
		return nil
	}
	return b.byteSize.Set(v)
}

func parseSize(v string) (int64, error) {
	s := strings.TrimSpace(v)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("%q is not a size (like 10MiB)", v)
	}
	return n * mult, nil
}

// parseServe reads flags, then fills what they left unset from FENCEGW_*
// variables. Flags win over the environment.
func parseServe(args []string, getenv func(string) string) (config, error) {
	cfg := config{
		Listen:         "127.0.0.1:8080",
		Data:           "fencegw-data",
		ForwardTimeout: gateway.DefaultForwardTimeout,
		GrantWait:      tokens.DefaultGrantWait,
		MaxBody:        gateway.DefaultMaxBody,
		LogLevel:       "info",
		BodyTimeout:    gateway.DefaultBodyTimeout,
		ShutdownDelay:  defaultShutdownDelay,

		IdempotencyWindow:     tokens.DefaultIdempotencyWindow,
		IdempotencyMaxBody:    tokens.DefaultIdempotencyMaxBody,
		IdempotencyMaxRecords: 100_000,
		GCHeadroom:            gcheadroom.Default,
	}
	ups := &upstreamList{m: map[string]*url.URL{}}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.ConfigFile, "config", "", "YAML configuration file: every flag a key of the same name, repeatable flags as lists; flags and FENCEGW_* override it; reread on SIGHUP and when replaced")
	fs.Var(address{&cfg.Listen}, "listen", "address to serve on")
	fs.StringVar(&cfg.Data, "data", cfg.Data, "directory of the embedded store")
	fs.Var(ups, "upstream", "a protected upstream, NAME=URL (repeatable)")
	fs.Var(storeURL{&cfg.Postgres, []string{"postgres", "postgresql"}, "user:password@127.0.0.1:5432/fencegw"}, "postgres", "PostgreSQL URL: tokens, fences, leases and rejections in PostgreSQL")
	fs.Var(storeURL{&cfg.Redis, []string{"redis", "rediss", "unix"}, "127.0.0.1:6379/0"}, "redis", "Redis URL: leases in Redis (needs --postgres)")
	fs.Var(duration{&cfg.ForwardTimeout}, "forward-timeout", "bound on one forward; then 504 and the drain period")
	fs.Var(duration{&cfg.DrainPeriod}, "drain-period", "how long a resource stays closed to grants after a forward with unknown outcome (default: the forward timeout)")
	fs.Var(duration{&cfg.GrantWait}, "grant-wait", "how long a grant waits for in-flight writes before 503 fence_busy")
	fs.Var(byteSize{&cfg.MaxBody}, "max-body", "largest fenced write body (like 10MiB)")
	fs.Var(logLevel{&cfg.LogLevel}, "log-level", logLevels)
	fs.Var(duration{&cfg.BodyTimeout}, "body-timeout", "bound on reading one request body (slow clients are cut off)")
	fs.Var(duration{&cfg.ShutdownDelay}, "shutdown-delay", "on SIGTERM, /readyz fails at once and the replica goes on serving this long before it stops accepting (load balancer check interval x fall count + margin; 0: stop at once)")
	fs.StringVar(&cfg.AuthFile, "auth-file", "", "API keys (hashed, with roles and resource prefixes) and upstream credentials, YAML or JSON")
	fs.Var(boolean{&cfg.InsecureNoAuth}, "insecure-no-auth", "allow listening on a non-loopback address without --auth-file")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "serve HTTPS with this certificate (PEM; needs --tls-key)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "the private key of --tls-cert (PEM)")
	observe := &observeList{}
	fs.Var(observe, "observe", "an upstream that only observes while workers move to the gateway, NAME (repeatable): writes under stale, expired or released leases are forwarded and recorded as would_refuse; it is NOT fenced")
	fs.Var(routeList{&cfg.Routes}, "route", "bind a path pattern under an upstream to the resources whose leases may write there, UPSTREAM/PATTERN=RESOURCE (repeatable)")
	fs.Var(hostNames{&cfg.HostsFlag}, "allowed-hosts", "the names clients reach the gateway by (comma-separated; '*': any); other Host headers are refused")
	var pgMax, pgLock int
	fs.Var(integer{&pgMax}, "pg-max-conns", "PostgreSQL query pool size (default 16)")
	fs.Var(integer{&pgLock}, "pg-lock-conns", "PostgreSQL connections for grants, releases and revokes waiting for or holding a resource's exclusive lock (default 8)")
	fs.StringVar(&cfg.PGSchema, "pg-schema", "", "PostgreSQL schema for fencegw's tables, created if missing; advisory lock keys and notification channels are per schema (default: the URL's search_path)")
	fs.StringVar(&cfg.RedisPrefix, "redis-prefix", "", "start of every Redis key and channel (default: fencegw: for the default schema, fencegw:<schema># with --pg-schema)")
	fs.Var(integer{&cfg.PGFenceSessions}, "pg-fence-sessions", "PostgreSQL sessions holding this replica's shared fences across writes (default 4)")
	fs.Var(integer{&cfg.PGMaxFences}, "pg-max-fences", "most resources this replica keeps fenced at once, each one advisory lock in PostgreSQL's shared lock table (default 4096)")
	fs.Var(duration{&cfg.PGSessionCheck}, "pg-session-check", "a replica stops admitting writes when it could not confirm its lock session for this long (default 1s); a dead replica's resources drain for --drain-period plus this")
	fs.Var(duration{&cfg.PGStatementTimeout}, "pg-statement-timeout", "PostgreSQL statement_timeout (default 5s)")
	fs.Var(duration{&cfg.PGLockTimeout}, "pg-lock-timeout", "bound on an advisory lock wait without an earlier deadline (default 30s)")
	fs.Var(duration{&cfg.IdempotencyWindow}, "idempotency-window", "how long an Idempotency-Key's record (and the answer it replays) is kept")
	fs.Var(byteSize{&cfg.IdempotencyMaxBody}, "idempotency-max-body", "largest upstream answer body kept for replay (like 64KiB); a longer one is replayed without its body")
	fs.Var(integer{&cfg.IdempotencyMaxRecords}, "idempotency-max-records", "most Idempotency-Key records kept; past it the oldest go first")
	fs.Var(byteSizeOrOff{byteSize{&cfg.GCHeadroom}}, "gc-headroom", "memory the garbage collector may let garbage take above twice the live heap before it collects (like 32MiB; 0: Go's default; GOGC set: GOGC's)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, errHelp
		}
		return cfg, flagError(err)
	}
	if fs.NArg() > 0 {
		return cfg, usageError("unexpected argument %q; %v", fs.Arg(0), errSeeHelp)
	}
	src := sources{}
	fs.Visit(func(f *flag.Flag) { src[f.Name] = "--" + f.Name })

	// The environment fills in the flags that were not given.
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if src[f.Name] != "" || envErr != nil {
			return
		}
		key := "FENCEGW_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if repeatable[f.Name] && f.Name != "allowed-hosts" { // that one is a list already
			list := "FENCEGW_" + strings.ToUpper(f.Name) + "S"
			v := getenv(list)
			if v == "" {
				list, v = key, getenv(key)
			}
			for item := range strings.SplitSeq(v, ",") {
				if item = strings.TrimSpace(item); item == "" {
					continue
				}
				src[f.Name] = list
				if err := f.Value.Set(item); err != nil {
					envErr = usageError("%s: %v", list, err)
					return
				}
			}
			return
		}
		if v := getenv(key); v != "" {
			src[f.Name] = key
			if err := f.Value.Set(v); err != nil {
				envErr = usageError("%s: %v", key, err)
			}
		}
	})
	if envErr != nil {
		return cfg, envErr
	}
	// The configuration file fills in what neither gave (configfile.go).
	if cfg.ConfigFile != "" {
		if err := applyConfigFile(fs, cfg.ConfigFile, src); err != nil {
			return cfg, err
		}
	}
	cfg.Upstreams = ups.m
	for _, name := range observe.names {
		if _, ok := cfg.Upstreams[name]; !ok {
			return cfg, src.bad("observe", "upstream %q is not configured (%s)", name, src.of("upstream"))
		}
		if cfg.Observe == nil {
			cfg.Observe = map[string]bool{}
		}
		cfg.Observe[name] = true
	}
	if cfg.Postgres == "" && strings.TrimSpace(cfg.Data) == "" { // only the embedded mode uses --data
		return cfg, src.bad("data", "must not be empty: the embedded store's directory (./fencegw-data unless told)")
	}
	var err error
	if cfg.Tracing, err = tracingSetting(getenv); err != nil {
		return cfg, err
	}
	for _, r := range cfg.Routes {
		if _, ok := cfg.Upstreams[r.Upstream()]; !ok {
			return cfg, src.bad("route", "%s: upstream %q is not configured (%s)", r, r.Upstream(), src.of("upstream"))
		}
	}
	switch {
	case pgMax < 0 || pgMax > 10000:
		return cfg, src.bad("pg-max-conns", "must be between 1 and 10000")
	case pgLock < 0 || pgLock > 10000:
		return cfg, src.bad("pg-lock-conns", "must be between 1 and 10000")
	}
	cfg.PGMaxConns, cfg.PGLockConns = int32(pgMax), int32(pgLock)
	switch {
	case cfg.PGFenceSessions < 0 || cfg.PGFenceSessions > 256:
		return cfg, src.bad("pg-fence-sessions", "must be between 1 and 256")
	case cfg.PGMaxFences < 0 || cfg.PGMaxFences > 1_000_000:
		return cfg, src.bad("pg-max-fences", "must be between 1 and 1000000")
	case cfg.PGSessionCheck < 0 || (cfg.PGSessionCheck > 0 && cfg.PGSessionCheck < 100*time.Millisecond):
		return cfg, src.bad("pg-session-check", "must be at least 100ms")
	}
	if cfg.DrainPeriod == 0 {
		cfg.DrainPeriod = cfg.ForwardTimeout
	}
	switch {
	case cfg.ForwardTimeout <= 0:
		return cfg, src.bad("forward-timeout", "must be positive")
	case cfg.DrainPeriod < 0:
		return cfg, src.bad("drain-period", "must not be negative")
	case cfg.GrantWait <= 0:
		return cfg, src.bad("grant-wait", "must be positive")
	case cfg.Redis != "" && cfg.Postgres == "":
		return cfg, src.bad("redis", "needs --postgres: a Redis counter is not a durable token source (failover and restarts lose recent writes and repeat tokens)")
	case cfg.RedisPrefix != "" && cfg.Redis == "":
		return cfg, src.bad("redis-prefix", "needs --redis")
	case cfg.BodyTimeout <= 0:
		return cfg, src.bad("body-timeout", "must be positive")
	case cfg.ShutdownDelay < 0 || cfg.ShutdownDelay > 10*time.Minute:
		return cfg, src.bad("shutdown-delay", "must be between 0 and 10m")
	case cfg.IdempotencyWindow < time.Minute:
		return cfg, src.bad("idempotency-window", "must be at least 1m")
	case cfg.IdempotencyMaxBody > 16<<20:
		return cfg, src.bad("idempotency-max-body", "must be at most 16MiB (records are kept in the store)")
	case cfg.IdempotencyMaxRecords < 1 || cfg.IdempotencyMaxRecords > 100_000_000:
		return cfg, src.bad("idempotency-max-records", "must be between 1 and 100000000")
	case cfg.GCHeadroom > 16<<30:
		return cfg, src.bad("gc-headroom", "must be at most 16GiB")
	}
	if err := parseSecurity(&cfg, src); err != nil {
		return cfg, err
	}
	cfg.src = src
	return cfg, nil
}

// repeatable are the flags given once per value; FENCEGW_<FLAG>S (or
// FENCEGW_<FLAG>) takes them comma-separated, the file as a list
// (--allowed-hosts is comma-separated itself: FENCEGW_ALLOWED_HOSTS).
var repeatable = map[string]bool{"upstream": true, "route": true, "observe": true, "allowed-hosts": true}

// sources says where each flag's value came from, as the user wrote it:
// "--listen", "FENCEGW_LISTEN" or "config.yaml: listen"; errors name it so.
type sources map[string]string

// of is the name the flag's value came by (--name if it has none).
func (s sources) of(name string) string {
	if v := s[name]; v != "" {
		return v
	}
	return "--" + name
}

// bad is a usage error about the flag's value, named as it came.
func (s sources) bad(name, format string, args ...any) error {
	return usageError("%s: "+format, append([]any{s.of(name)}, args...)...)
}

// flagError rewrites the flag package's errors ("invalid value "30" for
// flag -forward-timeout: …", "flag provided but not defined: -x") with
// flags spelled as the docs spell them.
func flagError(err error) error {
	msg := err.Error()
	if m := flagValueError.FindStringSubmatch(msg); m != nil {
		return usageError("--%s: %s", m[1], m[2])
	}
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return usageError("--%s is not a flag of fencegw serve; %v", strings.TrimLeft(name, "-"), errSeeHelp)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return usageError("--%s needs a value; %v", strings.TrimLeft(name, "-"), errSeeHelp)
	}
	return usageError("%s; %v", msg, errSeeHelp)
}

var flagValueError = regexp.MustCompile(`^invalid (?:boolean )?value ".*" for (?:flag )?-([\w-]+): (.*)$`)

// parseSecurity loads --auth-file, checks TLS files, and refuses to serve
// without authentication anywhere but on loopback unless told to.
func parseSecurity(cfg *config, src sources) error {
	if cfg.AuthFile != "" {
		a, err := auth.Load(cfg.AuthFile)
		if err != nil {
			return src.bad("auth-file", "%s: %v", cfg.AuthFile, err)
		}
		for name := range a.UpstreamHeaders {
			if _, ok := cfg.Upstreams[name]; !ok {
				return src.bad("auth-file", "%s: credentials for upstream %q, which is not configured (%s)", cfg.AuthFile, name, src.of("upstream"))
			}
		}
		cfg.Auth = a
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return usageError("%s and %s go together", src.of("tls-cert"), src.of("tls-key"))
	}
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return usageError("%s/%s: %v", src.of("tls-cert"), src.of("tls-key"), err)
		}
		cfg.Cert = &cert
	}
	switch {
	case len(cfg.HostsFlag) > 0 && slices.Contains(cfg.HostsFlag, "*"):
		cfg.AllowedHosts = nil
	case len(cfg.HostsFlag) > 0:
		cfg.AllowedHosts = append(append([]string(nil), gateway.LoopbackHosts...), cfg.HostsFlag...)
		if host, _, err := net.SplitHostPort(cfg.Listen); err == nil && host != "" && net.ParseIP(host) != nil && !net.ParseIP(host).IsUnspecified() && !slices.Contains(cfg.AllowedHosts, host) {
			cfg.AllowedHosts = append(cfg.AllowedHosts, host)
		}
	default:
		cfg.AllowedHosts = gateway.DefaultAllowedHosts(cfg.Listen)
	}
	if cfg.Auth == nil && !cfg.InsecureNoAuth && !loopback(cfg.Listen) {
		return src.bad("listen", "%s is not a loopback address and there is no --auth-file: anyone who can reach it could take leases and write to the upstreams; add --auth-file, or --insecure-no-auth if something in front authenticates", cfg.Listen)
	}
	return nil
}

// loopback reports whether addr (host:port) listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
