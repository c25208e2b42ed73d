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
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"
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
	fasthttp     string // the fasthttp setup's program
	// -grants beside etcd: its server and tools/etcd-locks ("": no etcd).
	etcd, etcdLocks string
	figures         string        // -figures: the one table's file
	memResources    int           // with -figures: fresh resources the memory figure is taken over
	grantsDuration  time.Duration // with -figures: how long grants (and etcd's acquisitions) are measured
	tls             bool
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
	switch {
	case o.figures != "":
		err = runFigures(ctx, o, args, stdout)
	case o.grants:
		err = runGrants(ctx, o, stdout)
	default:
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
	setups := fs.String("setups", "direct,bare-proxy,gateway,gateway-spread,peers", "setups to drive, comma-separated: direct, bare-proxy, gateway, gateway-spread, net-http (the ceiling: a Go net/http server that answers itself, forwarding nothing), gateway-postgres, gateway-postgres-spread (the --postgres mode on -postgres), nginx, haproxy, caddy, fasthttp (a bare reverse proxy on valyala/fasthttp, the ceiling of a Go proxy: see -fasthttp); peers: those of nginx, haproxy and caddy that are installed")
	fs.StringVar(&o.gateway, "gateway", "", "base URL of an existing gateway to drive instead of the embedded one")
	fs.StringVar(&o.upstreamName, "upstream-name", "", "with -gateway: the upstream name writes go to (/v1/proxy/NAME/...)")
	fs.StringVar(&o.direct, "direct", "", "with -gateway: full URL for the direct setup (POSTed to as is)")
	fs.StringVar(&o.bare, "bare", "", "with -gateway: full URL for the bare-proxy setup (POSTed to as is)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile to this file: with -servers process, of the gateway's process (from its start); inline, of the measured rounds of the whole process (pprof -tagfocus server=gateway)")
	fs.StringVar(&o.memProfile, "memprofile", "", "write an allocation profile to this file, of the gateway's process or (inline) of the measured rounds")
	fs.StringVar(&o.servers, "servers", "process", "run the bare proxy and the gateway in processes of their own, as the peers (process), or in this one (inline)")
	fs.StringVar(&o.fasthttp, "fasthttp", "fasthttp-ceiling", "the fasthttp setup's program, a name on PATH or a path; build it (a module of its own) with: "+fasthttpBuild)
	fs.StringVar(&o.etcdLocks, "etcd-locks", "", "with -grants: also measure lock acquisitions on etcd (a LeaseGrant and a put-if-absent each, as many acquirers, as long) with this program; build it (a module of its own) with: "+etcdLocksBuild)
	fs.StringVar(&o.figures, "figures", "", "measure the one table every doc quotes (writes of 32 writers and of 1 on direct, fasthttp, bare-proxy, gateway, nginx, haproxy, caddy; grants beside etcd: needs -fasthttp and -etcd-locks), write its numbers to this file and, if it is docs/figures.json, render them into README.md and docs/benchmarks.md (any other file: a trial run, the docs left as they are); run from the repository's root")
	fs.DurationVar(&o.grantsDuration, "figures-grants-duration", 20*time.Second, "with -figures: measured time of the grants and of etcd's acquisitions (each), at most "+maxDuration.String())
	// A million: the unit the figure is quoted in, and enough that the
	// collector's headroom (32 MiB of garbage held or not when memory is
	// read, internal/gcheadroom) moves it by 32 B a resource, not 160.
	fs.IntVar(&o.memResources, "figures-resources", 1_000_000, "with -figures: fresh resources granted for the memory figure (its growth per resource)")
	fs.StringVar(&o.etcd, "etcd", "etcd", "with -etcd-locks: etcd's server program (Debian: etcd-server), started on 127.0.0.1 in a temporary directory")
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
	case o.grantsDuration <= 0 || o.grantsDuration > maxDuration:
		return o, fmt.Errorf("-figures-grants-duration must be in (0, %s]", maxDuration)
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
	case o.etcdLocks != "" && !o.grants && o.figures == "":
		return o, errors.New("-etcd-locks goes with -grants or -figures")
	case o.figures != "" && (o.grants || o.gateway != ""):
		return o, errors.New("-figures runs its own writes and grants on the local setups (not with -grants or -gateway)")
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
		case "nginx", "haproxy", "caddy", "fasthttp":
			if _, err := lookPeer(s, o.fasthttp); err != nil {
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
			return o, fmt.Errorf("-setups: unknown setup %q (direct, bare-proxy, gateway, gateway-spread, net-http, gateway-postgres, gateway-postgres-spread, nginx, haproxy, caddy, peers, fasthttp)", s)
		}
	}
	return o, nil
}
