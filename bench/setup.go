// Package bench measures what fencing costs: the same small write sent
// straight to an upstream, through a bare httputil.ReverseProxy, and through
// the fencegw gateway on its embedded store, all on loopback with real HTTP
// servers (the gateway built by package replica, as fencegw serve builds
// it). The helpers here are shared by the Go benchmarks in this package
// and by cmd/fencegw-load.
package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/replica"
	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/tokens"
)

// UpstreamName is the name the gateway knows the benchmark upstream by.
const UpstreamName = "bench"

// WritePath is the path every write reaches on the upstream.
const WritePath = "/w"

// UpstreamReply is the upstream's answer to every write.
var UpstreamReply = []byte(`{"ok":true}` + "\n")

// Server is an http.Server on an ephemeral 127.0.0.1 port.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:PORT.
	URL *url.URL
	srv *http.Server
}

// Serve serves h on 127.0.0.1:0 until Close.
func Serve(h http.Handler) (*Server, error) {
	return ServeAs("server", h)
}

// ServeAs is Serve with the server's goroutines (each connection's, and the
// upstream connections its handlers dial) labelled server=role in CPU
// profiles, so that pprof -tagfocus server=role shows one server's whole
// cost in a process that also runs the clients and the upstream.
func ServeAs(role string, h http.Handler) (*Server, error) {
	return serve(role, "127.0.0.1:0", h, nil)
}

// ServeAt is ServeAs on addr (host:port) instead of an ephemeral port.
func ServeAt(role, addr string, h http.Handler) (*Server, error) {
	return serve(role, addr, h, nil)
}

// ServeTLSAt is ServeAt with TLS (cfg holds the certificate; nil: plain
// HTTP, as ServeAt); URL is https.
func ServeTLSAt(role, addr string, h http.Handler, cfg *tls.Config) (*Server, error) {
	if cfg == nil {
		return ServeAt(role, addr, h)
	}
	srv, err := serve(role, addr, h, func(_ *http.Server, ln net.Listener) net.Listener { return tls.NewListener(ln, cfg) })
	if err == nil {
		srv.URL.Scheme = "https"
	}
	return srv, err
}

// serve is ServeAt with the listener wrapped (TLS).
func serve(role, addr string, h http.Handler, wrap func(*http.Server, net.Listener) net.Listener) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
	}
	if wrap != nil {
		ln = wrap(srv, ln)
	}
	go pprof.Do(context.Background(), pprof.Labels("server", role), func(context.Context) { _ = srv.Serve(ln) })
	return &Server{URL: &url.URL{Scheme: "http", Host: ln.Addr().String()}, srv: srv}, nil
}

// Close stops the server at once.
func (s *Server) Close() error { return s.srv.Close() }

// Upstream is the protected service: it reads the whole body and answers
// 200 with UpstreamReply. It counts what it receives so that a benchmark can
// prove its requests arrived.
type Upstream struct {
	*Server
	// Requests counts requests received; Bytes, body bytes read.
	Requests, Bytes atomic.Int64
	// Fenced counts requests that carried a Fencing-Token header; Leaked,
	// requests that carried the Fencing-Lease secret (must stay 0).
	Fenced, Leaked atomic.Int64
}

// StartUpstream starts an Upstream on loopback.
func StartUpstream() (*Upstream, error) {
	u := &Upstream{}
	srv, err := ServeAs("upstream", http.HandlerFunc(u.serve))
	if err != nil {
		return nil, err
	}
	u.Server = srv
	return u, nil
}

func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	u.Requests.Add(1)
	u.Bytes.Add(n)
	if r.Header.Get(gateway.HeaderToken) != "" {
		u.Fenced.Add(1)
	}
	if r.Header.Get(gateway.HeaderLease) != "" {
		u.Leaked.Add(1)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(UpstreamReply)))
	_, _ = w.Write(UpstreamReply)
}

// NewFloor is the upstream's handler on a server of its own, forwarding
// nothing: what Go's net/http server costs by itself, the ceiling of any
// gateway built on it.
func NewFloor() http.Handler {
	u := &Upstream{}
	return http.HandlerFunc(u.serve)
}

// NewBareProxy is the baseline: an httputil.ReverseProxy to target as a
// careful user would set it up (Rewrite with SetURL, a buffer pool, and a
// transport tuned for keep-alive to one host), without any fencing.
func NewBareProxy(target *url.URL) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   512,
			IdleConnTimeout:       90 * time.Second,
			ExpectContinueTimeout: time.Second,
		},
		BufferPool: newBufferPool(),
		ErrorLog:   slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
	}
}

// bufferPool lends the bare proxy 32 KiB copy buffers, like the gateway's.
type bufferPool struct{ p sync.Pool }

func newBufferPool() *bufferPool {
	return &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
}

func (b *bufferPool) Get() []byte  { return *(b.p.Get().(*[]byte)) }
func (b *bufferPool) Put(v []byte) { b.p.Put(&v) }

// Gateway is a fencegw replica built as fencegw serve builds it
// (replica.New: the gateway's listener, Idempotency-Key records, write
// counts, dashboard), served on loopback with the benchmark upstream
// configured as UpstreamName.
type Gateway struct {
	// URL is the gateway's base URL.
	URL     *url.URL
	replica *replica.Replica
	// KeyCommits counts the embedded store's commits of idempotency
	// records (nil on PostgreSQL).
	KeyCommits func() int64
}

// StartGateway opens the embedded store in dir and serves a gateway
// forwarding UpstreamName to upstream. Logs are discarded.
func StartGateway(dir string, upstream *url.URL) (*Gateway, error) {
	return StartGatewayAt(dir, upstream, "127.0.0.1:0")
}

// StartGatewayAt is StartGateway listening on addr (host:port).
func StartGatewayAt(dir string, upstream *url.URL, addr string) (*Gateway, error) {
	return StartGatewayTLS(dir, upstream, addr, nil)
}

// StartGatewayTLS is StartGatewayAt terminating TLS with cfg (nil: plain
// HTTP), as fencegw serve --tls-cert does.
func StartGatewayTLS(dir string, upstream *url.URL, addr string, cfg *tls.Config) (*Gateway, error) {
	g, err := startGateway(context.Background(), "gateway", mode.Config{Data: dir}, upstream, addr, cfg)
	if err != nil {
		return nil, err
	}
	g.KeyCommits = g.replica.Mode().Store.(*bolt.Store).KeyCommits
	return g, nil
}

// StartPostgresGateway serves a gateway on PostgreSQL (the --postgres mode:
// writes admitted by the replica's fence) in schema, created if missing,
// forwarding UpstreamName to upstream.
func StartPostgresGateway(ctx context.Context, pgURL, schema string, upstream *url.URL, addr string, cfg *tls.Config) (*Gateway, error) {
	return startGateway(ctx, "gateway-postgres", mode.Config{Postgres: pgURL, Schema: schema}, upstream, addr, cfg)
}

// StartModeGateway serves a gateway on the storage mode m (any of the
// three), on an ephemeral loopback port, forwarding UpstreamName to
// upstream; its goroutines are labelled server=role in CPU profiles.
func StartModeGateway(ctx context.Context, role string, m mode.Config, upstream *url.URL) (*Gateway, error) {
	return startGateway(ctx, role, m, upstream, "127.0.0.1:0", nil)
}

// startGateway builds the replica and serves it with its goroutines (each
// connection's, and the upstream connections its handlers dial) labelled
// server=role in CPU profiles, as ServeAs does.
func startGateway(ctx context.Context, role string, m mode.Config, upstream *url.URL, addr string, cfg *tls.Config) (*Gateway, error) {
	r, err := replica.New(ctx, replica.Config{
		Mode:   m,
		Listen: addr,
		TLS:    cfg,
		Live:   gateway.Live{Upstreams: map[string]*url.URL{UpstreamName: upstream}},
	})
	if err != nil {
		return nil, err
	}
	pprof.Do(context.Background(), pprof.Labels("server", role), func(context.Context) { r.Start() })
	u, err := url.Parse(r.URL())
	if err != nil {
		r.Close()
		return nil, err
	}
	return &Gateway{URL: u, replica: r}, nil
}

// Service is the replica's tokens.Service, for benchmarks that drive it
// from Go.
func (g *Gateway) Service() *tokens.Service { return g.replica.Service() }

// Close stops the server, the gateway and the store.
func (g *Gateway) Close() error {
	g.replica.Close()
	return nil
}

// NewClient returns the HTTP client every setup is driven with: keep-alive,
// enough idle connections for conc concurrent workers, a 30 s bound per
// request.
func NewClient(conc int) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        max(conc*2, 100),
			MaxIdleConnsPerHost: max(conc*2, 100),
			IdleConnTimeout:     90 * time.Second,
		},
		Timeout: 30 * time.Second,
	}
}

// Target is one way to send a write: a URL and, for a fencing gateway, the
// leases to choose from (write i uses Leases[i % len(Leases)]).
type Target struct {
	Name   string
	URL    string
	Leases []string
	// Keyed: every write carries a fresh Idempotency-Key.
	Keyed bool
}

// keyPrefix makes Idempotency-Keys unique across runs; keySeq within one.
var (
	keyPrefix = strconv.FormatInt(time.Now().UnixNano(), 36)
	keySeq    atomic.Int64
)

// DirectTarget writes straight to the upstream.
func DirectTarget(upstream *url.URL) Target {
	return Target{Name: "direct", URL: upstream.String() + WritePath}
}

// BareProxyTarget writes through a bare reverse proxy to the upstream.
func BareProxyTarget(proxy *url.URL) Target {
	return Target{Name: "bare-proxy", URL: proxy.String() + WritePath}
}

// GatewayTarget writes through the gateway at base to its upstream named
// upstream, under leases.
func GatewayTarget(name string, base *url.URL, upstream string, leases []string) Target {
	return Target{Name: name, URL: base.String() + "/v1/proxy/" + url.PathEscape(upstream) + WritePath, Leases: leases}
}

// StatusError is a write answered with something other than 200.
type StatusError struct {
	Status int
	Body   string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("status %d: %s", e.Status, e.Body)
}

// Write sends body to t with POST, using write number i to pick a lease,
// reads the whole answer and returns it. A status other than 200 is a
// *StatusError.
func Write(ctx context.Context, c *http.Client, t Target, body []byte, i int) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if len(t.Leases) > 0 {
		req.Header.Set(gateway.HeaderLease, t.Leases[i%len(t.Leases)])
	}
	if t.Keyed {
		req.Header.Set(gateway.HeaderIdempotencyKey, `"`+keyPrefix+"-"+strconv.FormatInt(keySeq.Add(1), 36)+`"`)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return reply, &StatusError{Status: resp.StatusCode, Body: string(bytes.TrimSpace(reply))}
	}
	return reply, nil
}

// Acquire takes a lease on resource through the gateway's control API at
// base and returns its id.
func Acquire(ctx context.Context, c *http.Client, base *url.URL, resource, holder string, ttl time.Duration) (string, error) {
	payload, err := json.Marshal(map[string]any{"resource": resource, "holder": holder, "ttl_ms": ttl.Milliseconds()})
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base.String()+"/v1/leases", bytes.NewReader(payload))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusCreated {
		return "", &StatusError{Status: resp.StatusCode, Body: string(bytes.TrimSpace(reply))}
	}
	var lease struct {
		LeaseID string `json:"lease_id"`
		Token   int64  `json:"token"`
	}
	if err := json.Unmarshal(reply, &lease); err != nil {
		return "", fmt.Errorf("decode lease: %w", err)
	}
	if lease.LeaseID == "" || lease.Token < 1 {
		return "", fmt.Errorf("acquire %s: answer without lease id or token: %s", resource, reply)
	}
	return lease.LeaseID, nil
}

// AcquireMany takes n leases on resources prefix-0 … prefix-(n-1), with up
// to conc acquisitions in flight.
func AcquireMany(ctx context.Context, c *http.Client, base *url.URL, prefix string, n, conc int, ttl time.Duration) ([]string, error) {
	ids := make([]string, n)
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(conc, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				ids[i], errs[i] = Acquire(ctx, c, base, prefix+"-"+strconv.Itoa(i), "bench", ttl)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return ids, nil
}
