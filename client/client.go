// Package client is the Go SDK for fencegw workers: acquire a lease and its
// fencing token from the gateway, keep it alive in the background, learn
// when it is lost, and send writes to a protected upstream through the
// gateway so that stale ones are refused before they reach it.
//
//	c, err := client.New("http://127.0.0.1:8080")
//	lease, err := c.Acquire(ctx, "stmt:acct:88213", client.AcquireOptions{TTL: 10 * time.Second})
//	if err != nil { ... }             // errors.Is(err, client.ErrLeaseHeld): someone else has it
//	defer lease.Close()               // stop renewing and release
//
//	// Work under lease.Context(): it is cancelled when the lease is lost.
//	req, _ := http.NewRequestWithContext(lease.Context(), "POST", "http://statements/accounts/88213/lines", body)
//	resp, err := lease.Do(req)        // goes to the gateway's /v1/proxy/statements/accounts/88213/lines
//	if errors.Is(err, client.ErrStale) {
//		// a newer grant exists: the write did not reach the upstream; stop
//	}
//
// # What holding a Lease means
//
// Holding a *Lease does NOT mean the lease is held. A process can stall for
// longer than the TTL at any moment (a GC pause, CPU starvation, a stopped
// container, a slow call) and then carry on as if nothing happened: between
// any check (Err, Done, Context) and the next write, the lease may be lost
// and granted to another worker. Done and Context are a courtesy that stops
// work early in the common case; they are not what keeps data safe. What
// keeps data safe is the gateway's fence: a write sent through Do,
// Transport or HTTPClient carries the lease, and the gateway refuses it
// (ErrStale) unless the lease is the resource's current one at the moment
// the write is admitted. Writes that bypass the gateway have no such
// protection.
//
// # Time
//
// The gateway measures lease time (docs/design.md, guarantee 6). The SDK plans
// with its own monotonic clock: a lease counts as lost once the TTL the
// gateway reported has run out, minus a safety margin, counted from the
// moment the last successful acquire or renewal request was sent, without a
// later successful renewal. The gateway started its own count later than
// that, so the SDK gives up first.
package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fencegw/fencegw/api"
)

// Defaults, with their reasons.
const (
	// DefaultTTL is the lease TTL when AcquireOptions.TTL is zero: long
	// enough that a renewal every DefaultTTL/3 survives a few slow or failed
	// round trips, short enough that a crashed worker's resource is free
	// again within seconds.
	DefaultTTL = 15 * time.Second
	// DefaultCloseTimeout bounds the release request Close makes. A lease
	// that could not be released expires on its own after its TTL.
	DefaultCloseTimeout = 5 * time.Second
)

// Client talks to one fencegw gateway. It is safe for concurrent use.
type Client struct {
	base   *url.URL
	hc     *http.Client
	api    *api.ClientWithResponses
	holder string
}

// Option configures a Client.
type Option func(*Client) error

// WithHTTPClient sets the HTTP client used for every call: control calls
// and fenced writes (its Transport, Timeout and CheckRedirect apply). Nil
// or unset: a client with http.DefaultTransport and no timeout (calls are
// bounded by their contexts).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) error {
		if hc != nil {
			c.hc = hc
		}
		return nil
	}
}

// WithHolder sets the default holder label of acquired leases (shown on the
// dashboard and in rejections; at most 128 bytes). Unset: "HOSTNAME/PID".
func WithHolder(holder string) Option {
	return func(c *Client) error {
		c.holder = holder
		return nil
	}
}

// New returns a Client for the gateway at baseURL ("http://127.0.0.1:8080").
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("fencegw: gateway URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("fencegw: gateway URL %q: want http://HOST[:PORT] or https://...", baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = strings.TrimSuffix(u.RawPath, "/")
	u.RawQuery, u.Fragment = "", ""
	c := &Client{base: u, hc: &http.Client{}, holder: defaultHolder()}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	c.api, err = api.NewClientWithResponses(u.String(), api.WithHTTPClient(c.hc))
	if err != nil {
		return nil, fmt.Errorf("fencegw: %w", err)
	}
	return c, nil
}

func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}

// AcquireOptions are the options of one Acquire. The zero value asks for a
// DefaultTTL lease without waiting.
type AcquireOptions struct {
	// TTL is the lease's duration, measured by the gateway (100 ms to 1 h).
	// 0 means DefaultTTL. Renewals ask for the same TTL.
	TTL time.Duration
	// Holder labels the lease for humans; "" means the Client's default.
	Holder string
	// Wait is how long the gateway may wait for a held resource to become
	// free (at most 60 s); 0 answers at once. When it runs out the error
	// matches ErrLeaseHeld, or ErrUnavailable (fence_busy) if the resource
	// is free but writes under the previous token are still in flight.
	Wait time.Duration
	// SafetyMargin is subtracted from the TTL when the SDK decides, on its
	// own clock, that the lease has run out. 0 means TTL/10; negative means
	// none.
	SafetyMargin time.Duration
}

// Acquire asks the gateway for resource and returns the lease, renewing it
// in the background until Release, Close or Orphan, or until it is lost.
// ctx bounds this call only; the lease's own lifetime is independent of it
// (it keeps ctx's values).
//
// Errors: ErrLeaseHeld (another lease holds it), ErrUnavailable (503 or
// no answer), an *Error with Code invalid_request for bad input, or ctx's
// error. If ctx ends after the gateway granted the lease but before the
// answer arrived, the grant is unknown to the caller and simply expires.
func (c *Client) Acquire(ctx context.Context, resource string, opts AcquireOptions) (*Lease, error) {
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	holder := opts.Holder
	if holder == "" {
		holder = c.holder
	}
	body := api.AcquireRequest{Resource: resource, Holder: &holder, TtlMs: ttl.Milliseconds()}
	if opts.Wait > 0 {
		wait := opts.Wait.Milliseconds()
		body.WaitMs = &wait
	}
	// The lease's time is counted from here, on the monotonic clock: the
	// gateway starts its count only once the request arrives, later.
	sent := time.Now()
	resp, err := c.api.AcquireLeaseWithResponse(ctx, acquireClock(), body)
	if err != nil {
		return nil, transportError(OpAcquire, err)
	}
	if resp.StatusCode() != http.StatusCreated || resp.JSON201 == nil {
		return nil, answerError(OpAcquire, resp.HTTPResponse, resp.Body)
	}
	margin := opts.SafetyMargin
	switch {
	case margin == 0:
		margin = ttl / 10
	case margin < 0:
		margin = 0
	}
	return newLease(ctx, c, resp.JSON201, ttl, margin, sent)
}
