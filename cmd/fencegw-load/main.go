// Command fencegw-load measures what the fencing gateway costs.
//
// By default it starts, on 127.0.0.1, an upstream that answers 200, a bare
// httputil.ReverseProxy to it, and a fencegw gateway on the embedded store
// in a temporary directory; then it drives each setup with the same small
// POST from -concurrency workers and prints requests, req/s and latency
// percentiles per setup, and the gateway's ratios to the bare proxy. The
// setups are run in alternation (-rounds) so that background load on the
// machine hits them alike.
//
// With -grants it measures lease grants per second instead: -acquirers
// workers each acquiring leases on fresh resources through the HTTP API.
//
// With -gateway URL -upstream-name NAME it drives an existing gateway
// instead (and, if given, -direct and -bare write URLs for comparison); it
// acquires its leases on fencegw-load:* resources and releases them at the
// end.
//
// Every run is bounded: -duration is capped, and every request times out.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/bench"
)

// maxDuration bounds one invocation's measured time per setup.
const maxDuration = 10 * time.Minute

type options struct {
	duration     time.Duration
	warmup       time.Duration
	rounds       int
	concurrency  int
	acquirers    int
	resources    int
	bodySize     int
	grants       bool
	setups       []string
	gateway      string
	upstreamName string
	direct       string
	bare         string
	cpuProfile   string
	memProfile   string
	servers      string
	tls          bool
	// The hidden serve mode: this program as one setup's server.
	serveRole, serveListen, serveUpstream, serveDir string
	postgres, serveSchema                           string
	serveTLSCert, serveTLSKey                       string
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "fencegw-load: "+err.Error())
		return 2
	}
	if o.serveRole != "" {
		if err := runServe(o); err != nil {
			fmt.Fprintln(stderr, "fencegw-load -serve: "+err.Error())
			return 1
		}
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if o.grants {
		err = runGrants(ctx, o, stdout)
	} else {
		err = runWrites(ctx, o, stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "fencegw-load: "+err.Error())
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("fencegw-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured time per setup (split over -rounds), at most "+maxDuration.String())
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured warm-up per setup")
	fs.IntVar(&o.rounds, "rounds", 5, "alternate the setups this many times")
	fs.IntVar(&o.concurrency, "concurrency", 32, "concurrent writers")
	fs.IntVar(&o.acquirers, "acquirers", 64, "concurrent acquirers in -grants mode")
	fs.IntVar(&o.resources, "resources", 1000, "leases (one per resource) the gateway-spread setup picks from")
	fs.IntVar(&o.bodySize, "body-size", 256, "write body size in bytes")
	fs.BoolVar(&o.grants, "grants", false, "measure lease grants per second instead of writes")
	setups := fs.String("setups", "direct,bare-proxy,gateway,gateway-spread,peers", "setups to drive, comma-separated: direct, bare-proxy, gateway, gateway-spread, net-http (the ceiling: a Go net/http server that answers itself, forwarding nothing), gateway-postgres, gateway-postgres-spread (the --postgres mode on -postgres), nginx, haproxy, caddy; peers: those of nginx, haproxy and caddy that are installed")
	fs.StringVar(&o.gateway, "gateway", "", "base URL of an existing gateway to drive instead of the embedded one")
	fs.StringVar(&o.upstreamName, "upstream-name", "", "with -gateway: the upstream name writes go to (/v1/proxy/NAME/...)")
	fs.StringVar(&o.direct, "direct", "", "with -gateway: full URL for the direct setup (POSTed to as is)")
	fs.StringVar(&o.bare, "bare", "", "with -gateway: full URL for the bare-proxy setup (POSTed to as is)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile to this file: with -servers process, of the gateway's process (from its start); inline, of the measured rounds of the whole process (pprof -tagfocus server=gateway)")
	fs.StringVar(&o.memProfile, "memprofile", "", "write an allocation profile to this file, of the gateway's process or (inline) of the measured rounds")
	fs.StringVar(&o.servers, "servers", "process", "run the bare proxy and the gateway in processes of their own, as the peers (process), or in this one (inline)")
	fs.BoolVar(&o.tls, "tls", false, "clients speak TLS (HTTP/1.1) to the bare proxy, the gateway and the peers, with a self-signed certificate for 127.0.0.1; the upstream stays plain HTTP")
	fs.StringVar(&o.serveTLSCert, "serve-tls-cert", "", "internal: with -serve, the certificate file")
	fs.StringVar(&o.serveTLSKey, "serve-tls-key", "", "internal: with -serve, the key file")
	fs.StringVar(&o.serveRole, "serve", "", "internal: serve one setup (gateway, bare-proxy) until SIGTERM")
	fs.StringVar(&o.serveListen, "serve-listen", "", "internal: with -serve, the address")
	fs.StringVar(&o.serveUpstream, "serve-upstream", "", "internal: with -serve, the upstream URL")
	fs.StringVar(&o.serveDir, "serve-dir", "", "internal: with -serve gateway, the store's directory")
	fs.StringVar(&o.postgres, "postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL for the gateway-postgres setups (a schema of their own is created and dropped)")
	fs.StringVar(&o.serveSchema, "serve-schema", "", "internal: with -serve gateway-postgres, the schema")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fencegw-load [flags]\n\nStarts an upstream, a bare reverse proxy and an embedded gateway on 127.0.0.1\n(or drives -gateway URL) and compares them. Flags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case o.duration <= 0 || o.duration > maxDuration:
		return o, fmt.Errorf("-duration must be in (0, %s]", maxDuration)
	case o.warmup < 0 || o.warmup > time.Minute:
		return o, errors.New("-warmup must be in [0, 1m]")
	case o.rounds < 1 || o.rounds > 1000:
		return o, errors.New("-rounds must be in [1, 1000]")
	case o.concurrency < 1 || o.concurrency > 4096:
		return o, errors.New("-concurrency must be in [1, 4096]")
	case o.acquirers < 1 || o.acquirers > 4096:
		return o, errors.New("-acquirers must be in [1, 4096]")
	case o.resources < 1 || o.resources > 100_000:
		return o, errors.New("-resources must be in [1, 100000]")
	case o.bodySize < 0 || o.bodySize > 10<<20:
		return o, errors.New("-body-size must be in [0, 10MiB]")
	case o.tls && o.gateway != "":
		return o, errors.New("-tls goes with the local setups, not -gateway (give -gateway an https URL instead)")
	case o.servers != "process" && o.servers != "inline":
		return o, errors.New("-servers must be process or inline")
	case o.gateway != "" && o.upstreamName == "" && !o.grants:
		return o, errors.New("-gateway needs -upstream-name")
	case o.gateway == "" && (o.direct != "" || o.bare != "" || o.upstreamName != ""):
		return o, errors.New("-direct, -bare and -upstream-name go with -gateway")
	}
	for _, s := range strings.Split(*setups, ",") {
		switch s = strings.TrimSpace(s); s {
		case "direct", "bare-proxy", "gateway", "gateway-spread", "net-http":
			o.setups = append(o.setups, s)
		case "gateway-postgres", "gateway-postgres-spread":
			if o.gateway != "" {
				return o, fmt.Errorf("-setups: %s runs only with the local setups (not with -gateway)", s)
			}
			o.setups = append(o.setups, s)
		case "nginx", "haproxy", "caddy":
			if _, err := lookPeer(s); err != nil {
				return o, fmt.Errorf("-setups: %w", err)
			}
			if o.gateway != "" {
				return o, fmt.Errorf("-setups: %s runs only with the local setups (not with -gateway)", s)
			}
			o.setups = append(o.setups, s)
		case "peers":
			if o.gateway == "" && !o.grants {
				o.setups = append(o.setups, installedPeers()...)
			}
		case "":
		default:
			return o, fmt.Errorf("-setups: unknown setup %q (direct, bare-proxy, gateway, gateway-spread, net-http, gateway-postgres, gateway-postgres-spread, nginx, haproxy, caddy, peers)", s)
		}
	}
	return o, nil
}

// env is what the tool drives: a gateway, and the targets of each setup.
type env struct {
	gateway *url.URL
	// gatewayPG is the gateway on PostgreSQL (the gateway-postgres setups).
	gatewayPG *url.URL
	upstream  string // the gateway's name for it
	client    *http.Client
	local     *bench.Upstream // nil when driving an existing deployment
	peers     map[string]*peer
	targets   map[string]bench.Target
	leases    []string // to release at the end (existing deployment only)
	close     func()
}

// startLocal starts the three setups on loopback.
func startLocal(ctx context.Context, o options, conc int, setups []string) (*env, error) {
	up, err := bench.StartUpstream()
	if err != nil {
		return nil, err
	}
	e := &env{
		upstream: bench.UpstreamName,
		client:   bench.NewClient(conc),
		local:    up,
		targets:  map[string]bench.Target{"direct": bench.DirectTarget(up.URL)},
		peers:    map[string]*peer{},
	}
	var closers []func() error
	e.close = func() {
		for _, p := range e.peers {
			p.stop()
		}
		e.client.CloseIdleConnections()
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
		_ = up.Close()
	}
	var tt *testTLS
	if o.tls {
		dir, err := os.MkdirTemp("", "fencegw-load-tls-")
		if err != nil {
			e.close()
			return nil, err
		}
		closers = append(closers, func() error { return os.RemoveAll(dir) })
		if tt, err = newTestTLS(dir); err != nil {
			e.close()
			return nil, err
		}
		e.client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: tt.pool}
	}
	if o.servers == "process" {
		for _, role := range []string{"bare-proxy", "gateway"} {
			p, err := startSelf(ctx, o, role, up.URL, tt)
			if err != nil {
				e.close()
				return nil, err
			}
			e.peers[role] = p
		}
		e.targets["bare-proxy"] = bench.BareProxyTarget(e.peers["bare-proxy"].url)
		e.gateway = e.peers["gateway"].url
	} else {
		var bare *bench.Server
		var err error
		if tt != nil {
			bare, err = bench.ServeTLSAt("bare-proxy", "127.0.0.1:0", bench.NewBareProxy(up.URL), tt.config)
		} else {
			bare, err = bench.ServeAs("bare-proxy", bench.NewBareProxy(up.URL))
		}
		if err != nil {
			e.close()
			return nil, err
		}
		closers = append(closers, bare.Close)
		e.targets["bare-proxy"] = bench.BareProxyTarget(bare.URL)
		dir, err := os.MkdirTemp("", "fencegw-load-")
		if err != nil {
			e.close()
			return nil, err
		}
		closers = append(closers, func() error { return os.RemoveAll(dir) })
		var cfg *tls.Config
		if tt != nil {
			cfg = tt.config
		}
		gw, err := bench.StartGatewayTLS(dir, up.URL, "127.0.0.1:0", cfg)
		if err != nil {
			e.close()
			return nil, err
		}
		closers = append(closers, gw.Close)
		e.gateway = gw.URL
	}
	if slices.Contains(setups, "net-http") {
		// The ceiling of any gateway built on net/http: its server, with the
		// upstream's handler, forwarding nothing.
		if o.servers == "process" {
			p, err := startSelf(ctx, o, "net-http", up.URL, tt)
			if err != nil {
				e.close()
				return nil, err
			}
			e.peers["net-http"] = p
			e.targets["net-http"] = bench.Target{Name: "net-http", URL: p.url.String() + bench.WritePath}
		} else {
			var srv *bench.Server
			if tt != nil {
				srv, err = bench.ServeTLSAt("net-http", "127.0.0.1:0", bench.NewFloor(), tt.config)
			} else {
				srv, err = bench.ServeAs("net-http", bench.NewFloor())
			}
			if err != nil {
				e.close()
				return nil, err
			}
			closers = append(closers, srv.Close)
			e.targets["net-http"] = bench.Target{Name: "net-http", URL: srv.URL.String() + bench.WritePath}
		}
	}
	if slices.ContainsFunc(setups, func(s string) bool { return strings.HasPrefix(s, "gateway-postgres") }) {
		schema := "fencegw_load_" + strconv.FormatInt(time.Now().UnixNano(), 36)
		closers = append(closers, func() error { return dropSchema(o.postgres, schema) })
		p, err := startSelf(ctx, o, "gateway-postgres", up.URL, tt, "-serve-schema", schema)
		if err != nil {
			e.close()
			return nil, err
		}
		e.peers["gateway-postgres"] = p
		e.gatewayPG = p.url
	}
	for _, s := range setups {
		if _, isPeer := peerBinary[s]; !isPeer {
			continue
		}
		p, err := startPeer(ctx, s, up.URL, tt)
		if err != nil {
			e.close()
			return nil, err
		}
		e.peers[s] = p
		e.targets[s] = bench.Target{Name: s, URL: p.url.String() + bench.WritePath}
	}
	return e, nil
}

// startRemote drives an existing gateway (and optional direct/bare URLs).
func startRemote(o options, conc int) (*env, error) {
	base, err := url.Parse(strings.TrimSuffix(o.gateway, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("-gateway %q is not an http(s) URL", o.gateway)
	}
	e := &env{gateway: base, upstream: o.upstreamName, client: bench.NewClient(conc), targets: map[string]bench.Target{}}
	for name, u := range map[string]string{"direct": o.direct, "bare-proxy": o.bare} {
		if u == "" {
			continue
		}
		if _, err := url.Parse(u); err != nil {
			return nil, fmt.Errorf("-%s: %w", strings.TrimSuffix(name, "-proxy"), err)
		}
		e.targets[name] = bench.Target{Name: name, URL: u}
	}
	e.close = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, id := range e.leases {
			release(ctx, e.client, e.gateway, id)
		}
		e.client.CloseIdleConnections()
	}
	return e, nil
}

// release gives a lease back, best effort.
func release(ctx context.Context, c *http.Client, base *url.URL, id string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, base.String()+"/v1/leases/"+url.PathEscape(id), nil)
	if err != nil {
		return
	}
	if resp, err := c.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
}

func runWrites(ctx context.Context, o options, out io.Writer) error {
	var e *env
	var err error
	if o.gateway == "" {
		e, err = startLocal(ctx, o, o.concurrency, o.setups)
	} else {
		e, err = startRemote(o, o.concurrency)
	}
	if err != nil {
		return err
	}
	defer e.close()

	// Leases outlive the run: warm-up and measurement of every setup.
	ttl := min(time.Hour, time.Duration(len(o.setups))*(o.duration+o.warmup)+time.Minute)
	prefix := "fencegw-load:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var setups []string
	for _, s := range o.setups {
		switch s {
		case "gateway", "gateway-spread", "gateway-postgres", "gateway-postgres-spread":
			n := 1
			if strings.HasSuffix(s, "-spread") {
				n = o.resources
			}
			gw := e.gateway
			if strings.HasPrefix(s, "gateway-postgres") {
				gw = e.gatewayPG
			}
			ids, err := bench.AcquireMany(ctx, e.client, gw, prefix+":"+s, n, 64, ttl)
			if err != nil {
				return fmt.Errorf("acquire leases for %s: %w", s, err)
			}
			e.leases = append(e.leases, ids...)
			e.targets[s] = bench.GatewayTarget(s, gw, e.upstream, ids)
		}
		if _, ok := e.targets[s]; ok {
			setups = append(setups, s)
		}
	}
	if len(setups) == 0 {
		return errors.New("no setup to drive")
	}

	body := bytes.Repeat([]byte("x"), o.bodySize)
	op := func(t bench.Target) func(ctx context.Context, _, _ int) error {
		return func(ctx context.Context, _, _ int) error {
			_, err := bench.Write(ctx, e.client, t, body, rand.IntN(1<<30))
			return err
		}
	}
	proto := "HTTP/1.1"
	if o.tls {
		proto = "HTTPS (TLS to the proxies, HTTP/1.1)"
	}
	fmt.Fprintf(out, "fencegw-load: %d writers, %d B bodies, %s, %s per setup in %d rounds, GOMAXPROCS=%d (the load generator shares the CPUs with the servers)\n",
		o.concurrency, o.bodySize, proto, o.duration, o.rounds, runtime.GOMAXPROCS(0))
	for _, s := range setups {
		if o.warmup > 0 {
			r := bench.RunFor(ctx, s, o.warmup, o.concurrency, op(e.targets[s]))
			if r.Errors > 0 {
				return fmt.Errorf("%s: warm-up: %d writes failed; first: %w", s, r.Errors, r.FirstErr)
			}
		}
	}
	var delivered int64
	if e.local != nil {
		delivered = e.local.Requests.Load()
	}
	stopProfiles := func() error { return nil }
	if o.servers == "inline" || o.gateway != "" {
		if stopProfiles, err = startProfiles(o); err != nil {
			return err
		}
	}
	results := make(map[string]*merged, len(setups))
	for round := range o.rounds {
		for _, s := range rotate(setups, round) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			p := e.peers[strings.TrimSuffix(s, "-spread")] // a spread setup is its gateway's
			self0, peer0 := selfCPU(), time.Duration(0)
			if p != nil {
				peer0 = p.cpu()
			}
			r := bench.RunFor(ctx, s, o.duration/time.Duration(o.rounds), o.concurrency, op(e.targets[s]))
			if results[s] == nil {
				results[s] = &merged{}
			}
			results[s].add(r)
			results[s].selfCPU += selfCPU() - self0
			if p != nil {
				results[s].peerCPU += p.cpu() - peer0
			}
		}
	}
	if err := stopProfiles(); err != nil {
		return err
	}
	if e.local != nil {
		var sent int64
		for s, m := range results {
			if s != "net-http" { // answers itself
				sent += int64(m.requests)
			}
		}
		if got := e.local.Requests.Load() - delivered; got != sent {
			return fmt.Errorf("the upstream received %d writes, the clients saw %d answered: the setup is broken", got, sent)
		}
		if e.local.Leaked.Load() != 0 {
			return errors.New("writes reached the upstream with the Fencing-Lease secret")
		}
	}
	printWrites(out, setups, results)
	for _, s := range setups {
		if m := results[s]; m.errors > 0 {
			return fmt.Errorf("%s: %d writes failed; first: %w", s, m.errors, m.firstErr)
		}
	}
	return nil
}

// runServe serves one setup until SIGTERM or SIGINT (the parent's
// startSelf).
func runServe(o options) error {
	up, err := url.Parse(o.serveUpstream)
	if err != nil || up.Host == "" {
		return fmt.Errorf("-serve-upstream %q is not a URL", o.serveUpstream)
	}
	var cfg *tls.Config
	if o.serveTLSCert != "" {
		if cfg, err = loadServerTLS(o.serveTLSCert, o.serveTLSKey); err != nil {
			return err
		}
	}
	var closeServer func() error
	switch o.serveRole {
	case "gateway":
		gw, err := bench.StartGatewayTLS(o.serveDir, up, o.serveListen, cfg)
		if err != nil {
			return err
		}
		closeServer = gw.Close
	case "gateway-postgres":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		gw, err := bench.StartPostgresGateway(ctx, o.postgres, o.serveSchema, up, o.serveListen, cfg)
		cancel()
		if err != nil {
			return err
		}
		closeServer = gw.Close
	case "net-http":
		var srv *bench.Server
		if cfg != nil {
			srv, err = bench.ServeTLSAt("net-http", o.serveListen, bench.NewFloor(), cfg)
		} else {
			srv, err = bench.ServeAt("net-http", o.serveListen, bench.NewFloor())
		}
		if err != nil {
			return err
		}
		closeServer = srv.Close
	case "bare-proxy":
		var srv *bench.Server
		if cfg != nil {
			srv, err = bench.ServeTLSAt("bare-proxy", o.serveListen, bench.NewBareProxy(up), cfg)
		} else {
			srv, err = bench.ServeAt("bare-proxy", o.serveListen, bench.NewBareProxy(up))
		}
		if err != nil {
			return err
		}
		closeServer = srv.Close
	default:
		return fmt.Errorf("-serve %q: not gateway, gateway-postgres, bare-proxy or net-http", o.serveRole)
	}
	stopProfiles, err := startProfiles(o)
	if err != nil {
		_ = closeServer()
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	return errors.Join(stopProfiles(), closeServer())
}

// startProfiles starts the CPU profile and marks the start of the
// allocation profile (-memprofile FILE also writes FILE.start: pass it to
// pprof -base to see only the measured rounds). The returned func stops and
// writes them.
func startProfiles(o options) (stop func() error, err error) {
	var cpu *os.File
	if o.cpuProfile != "" {
		if cpu, err = os.Create(o.cpuProfile); err != nil {
			return nil, err
		}
		if err = pprof.StartCPUProfile(cpu); err != nil {
			_ = cpu.Close()
			return nil, err
		}
	}
	if o.memProfile != "" {
		if err = writeAllocs(o.memProfile + ".start"); err != nil {
			if cpu != nil {
				pprof.StopCPUProfile()
				_ = cpu.Close()
			}
			return nil, err
		}
	}
	return func() error {
		var errs []error
		if cpu != nil {
			pprof.StopCPUProfile()
			errs = append(errs, cpu.Close())
		}
		if o.memProfile != "" {
			errs = append(errs, writeAllocs(o.memProfile))
		}
		return errors.Join(errs...)
	}, nil
}

func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
}

// rotate starts round r at a different setup, so no setup always runs first.
func rotate(s []string, r int) []string {
	k := r % len(s)
	return append(append([]string{}, s[k:]...), s[:k]...)
}

// merged accumulates one setup's rounds, keeping every latency.
type merged struct {
	requests, errors int
	firstErr         error
	elapsed          time.Duration
	samples          []time.Duration
	// selfCPU is this process's CPU time during the setup's slices
	// (clients, upstream, in-process servers); peerCPU, the peer
	// proxy's processes'.
	selfCPU, peerCPU time.Duration
}

// perRequest is d per answered request, in µs.
func (m *merged) perRequest(d time.Duration) float64 {
	if m.requests == 0 {
		return 0
	}
	return float64(d) / 1e3 / float64(m.requests)
}

func (m *merged) add(r bench.Result) {
	m.requests += r.Requests
	m.errors += r.Errors
	m.elapsed += r.Elapsed
	m.samples = append(m.samples, r.Samples...)
	if m.firstErr == nil {
		m.firstErr = r.FirstErr
	}
}

func us(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 0, 64) }

// printWrites prints one row per setup, then each setup's ratios to the
// bare proxy and to nginx. CPU per request: "all" is this process's CPU
// (clients, upstream, in-process servers) plus a peer's own; "server" is
// a peer's own, or for an in-process server this process's per request
// minus the direct setup's (what the clients and the upstream cost).
func printWrites(out io.Writer, setups []string, results map[string]*merged) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "setup\trequests\terrors\treq/s\tp50 µs\tp90 µs\tp99 µs\tmax µs\tCPU µs/req all\tserver\t")
	sums := map[string]bench.Summary{}
	rates := map[string]float64{}
	server := map[string]float64{}
	var direct float64
	if m, ok := results["direct"]; ok {
		direct = m.perRequest(m.selfCPU)
	}
	for _, s := range setups {
		m := results[s]
		sum := bench.Summarize(m.samples)
		sums[s] = sum
		rates[s] = float64(m.requests) / m.elapsed.Seconds()
		cpu := "-"
		switch {
		case m.peerCPU > 0:
			server[s] = m.perRequest(m.peerCPU)
		case s != "direct" && direct > 0:
			server[s] = m.perRequest(m.selfCPU) - direct
		}
		if v, ok := server[s]; ok {
			cpu = strconv.FormatFloat(v, 'f', 1, 64)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%.1f\t%s\t\n", s, m.requests, m.errors, rates[s], us(sum.P50), us(sum.P90), us(sum.P99), us(sum.Max),
			m.perRequest(m.selfCPU+m.peerCPU), cpu)
	}
	_ = tw.Flush()
	for _, ref := range []string{"bare-proxy", "nginx"} {
		if _, ok := sums[ref]; !ok {
			continue
		}
		for _, s := range setups {
			if s == ref || s == "direct" {
				continue
			}
			line := fmt.Sprintf("%s / %s: throughput %.2f, p50 %+.0f µs, p99 %+.0f µs", s, ref,
				rates[s]/rates[ref], float64(sums[s].P50-sums[ref].P50)/1e3, float64(sums[s].P99-sums[ref].P99)/1e3)
			if server[s] > 0 && server[ref] > 0 {
				line += fmt.Sprintf(", server CPU per request %.2f", server[s]/server[ref])
			}
			fmt.Fprintln(out, line)
		}
	}
	// The PostgreSQL mode against the embedded one, on 1 and on many
	// resources.
	for _, pair := range [][2]string{{"gateway-postgres", "gateway"}, {"gateway-postgres-spread", "gateway-spread"}} {
		s, ref := pair[0], pair[1]
		if _, ok := sums[s]; !ok {
			continue
		}
		if _, ok := sums[ref]; !ok {
			continue
		}
		p50 := 100 * (float64(sums[s].P50)/float64(sums[ref].P50) - 1)
		fmt.Fprintf(out, "%s / %s: throughput %.2f, p50 %+.0f %%\n", s, ref, rates[s]/rates[ref], p50)
	}
}

func runGrants(ctx context.Context, o options, out io.Writer) error {
	var e *env
	var err error
	if o.gateway == "" {
		e, err = startLocal(ctx, o, o.acquirers, nil)
	} else {
		e, err = startRemote(o, o.acquirers)
	}
	if err != nil {
		return err
	}
	defer e.close()
	prefix := "fencegw-load:grant:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	var seq atomic.Int64
	op := func(ctx context.Context, _, _ int) error {
		// A short TTL: these leases are never written under.
		_, err := bench.Acquire(ctx, e.client, e.gateway, prefix+strconv.FormatInt(seq.Add(1), 10), "fencegw-load", time.Second)
		return err
	}
	fmt.Fprintf(out, "fencegw-load -grants: %d acquirers on fresh resources, %s, GOMAXPROCS=%d (the load generator shares the CPUs with the gateway)\n",
		o.acquirers, o.duration, runtime.GOMAXPROCS(0))
	if o.warmup > 0 {
		bench.RunFor(ctx, "warm-up", o.warmup, o.acquirers, op)
	}
	// The gateway's own CPU per grant (its process, with -servers process):
	// on a shared machine, or a slow disk, grants/s says more about the
	// neighbours and the fsyncs than about the gateway.
	gw := e.peers["gateway"]
	var cpu0 time.Duration
	if gw != nil {
		cpu0 = gw.cpu()
	}
	r := bench.RunFor(ctx, "grants", o.duration, o.acquirers, op)
	cpu := "-"
	if gw != nil && r.Requests > 0 {
		cpu = strconv.FormatFloat(float64(gw.cpu()-cpu0)/float64(time.Microsecond)/float64(r.Requests), 'f', 1, 64)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "setup\tgrants\terrors\tgrants/s\tp50 µs\tp90 µs\tp99 µs\tmax µs\tserver CPU µs/grant\t")
	fmt.Fprintf(tw, "gateway\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", r.Requests, r.Errors, r.PerSecond(), us(r.Latency.P50), us(r.Latency.P90), us(r.Latency.P99), us(r.Latency.Max), cpu)
	_ = tw.Flush()
	if p := e.peers["gateway"]; p != nil {
		fmt.Fprintln(out, memoryReport(p, r.Requests))
	}
	if r.Errors > 0 {
		return fmt.Errorf("%d grants failed; first: %w", r.Errors, r.FirstErr)
	}
	return nil
}

// memoryReport describes the gateway process's memory after grants on
// fresh resources (/proc/PID/status; bbolt's file is mapped, so it shows
// as RssFile) and the store file's size.
func memoryReport(p *peer, grants int) string {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		return "gateway memory: " + err.Error()
	}
	kb := map[string]int64{}
	for _, line := range strings.Split(string(st), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			kb[k], _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	var file int64
	if fi, err := os.Stat(filepath.Join(p.dir, "fencegw.db")); err == nil {
		file = fi.Size()
	}
	mib := func(k int64) string { return strconv.FormatFloat(float64(k)/1024, 'f', 0, 64) + " MiB" }
	per := ""
	if grants > 0 {
		per = fmt.Sprintf(" (%.0f B anonymous per resource granted)", float64(kb["RssAnon"])*1024/float64(grants))
	}
	return fmt.Sprintf("gateway process after %d grants on fresh resources: RSS %s (anonymous %s, file-mapped %s), peak %s; store file %s%s",
		grants, mib(kb["VmRSS"]), mib(kb["RssAnon"]), mib(kb["RssFile"]), mib(kb["VmHWM"]), mib(file/1024), per)
}

// dropSchema removes the gateway-postgres setups' schema.
func dropSchema(pgURL, schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	return err
}
