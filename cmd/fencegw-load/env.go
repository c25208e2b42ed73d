package main

// The environment a run drives: the gateway and the targets of each setup,
// started here (in process or as child servers) or reached at -gateway.

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/bench"
)

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

// start starts the setups on loopback, or drives o.gateway: conc is how
// many clients the run uses at once.
func start(ctx context.Context, o options, conc int, setups []string) (*env, error) {
	if o.gateway != "" {
		return startRemote(o, conc)
	}
	return startLocal(ctx, o, conc, setups)
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
		bare, err := bench.ServeTLSAt("bare-proxy", "127.0.0.1:0", bench.NewBareProxy(up.URL), tt.serverConfig())
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
		gw, err := bench.StartGatewayTLS(dir, up.URL, "127.0.0.1:0", tt.serverConfig())
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
			srv, err := bench.ServeTLSAt("net-http", "127.0.0.1:0", bench.NewFloor(), tt.serverConfig())
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
		bin, err := lookPeer(s, o.fasthttp)
		if err != nil {
			e.close()
			return nil, err
		}
		p, err := startPeer(ctx, s, bin, up.URL, tt)
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
