package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// Role is what an authenticated principal may do. Roles are ordered: each
// includes everything the ones below it may do.
type Role int

// Roles, lowest first.
const (
	// RoleViewer reads: resources, leases, the rejection log and stream,
	// the dashboard, metrics.
	RoleViewer Role = iota + 1
	// RoleWorker also acquires, renews and releases leases and sends
	// fenced writes.
	RoleWorker
	// RoleAdmin also revokes any lease.
	RoleAdmin
)

func (r Role) String() string {
	switch r {
	case RoleViewer:
		return "viewer"
	case RoleWorker:
		return "worker"
	case RoleAdmin:
		return "admin"
	}
	return "role(" + strconv.Itoa(int(r)) + ")"
}

// Principal is an authenticated caller: one API key.
type Principal struct {
	// Name identifies the key; leases are bound to it (tokens.Lease.Owner)
	// and revocations are recorded under it.
	Name string
	Role Role
	// Resources are the resource-name prefixes the key may use; empty
	// means every resource.
	Resources []string
	// MaxTTL caps the ttl_ms of the key's acquires and renewals (0: only
	// the gateway's limit).
	MaxTTL time.Duration
	// MaxLeases caps the key's live leases at once (0: no cap). Counted
	// when a lease is acquired, so concurrent acquires of one key may
	// overshoot it by their number.
	MaxLeases int
}

// MayUse reports whether p may use resource (a prefix match).
func (p *Principal) MayUse(resource string) bool {
	if len(p.Resources) == 0 {
		return true
	}
	for _, prefix := range p.Resources {
		if strings.HasPrefix(resource, prefix) {
			return true
		}
	}
	return false
}

// Authenticator identifies callers and meters them. Config.Auth nil means
// no authentication: every caller may do everything.
type Authenticator interface {
	// Authenticate returns the caller of r, or an error wrapping
	// ErrUnauthenticated (no key, an unknown key, a malformed header).
	Authenticate(r *http.Request) (*Principal, error)
	// Allow takes one request from p's rate budget. When none is left it
	// returns false and how long until there is one.
	Allow(p *Principal) (ok bool, retryAfter time.Duration)
}

// Sentinels of the security checks; problemFor maps them to 401, 403, 429.
var (
	// ErrUnauthenticated: no API key, or not a valid one.
	ErrUnauthenticated = errors.New("unauthenticated")
	errForbidden       = errors.New("forbidden")
	errRateLimited     = errors.New("rate limited")
	errTooManyLeases   = errors.New("too many leases")
)

type principalKey struct{}

// principalFrom returns the authenticated caller, or nil without
// authentication.
func principalFrom(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// principalName is the caller's name, "" without authentication (which
// skips the lease-ownership checks).
func principalName(ctx context.Context) string {
	if p := principalFrom(ctx); p != nil {
		return p.Name
	}
	return ""
}

// mayUse checks the caller's resource prefixes (always true without
// authentication).
func mayUse(ctx context.Context, resource string) error {
	if p := principalFrom(ctx); p != nil && !p.MayUse(resource) {
		return &tokens.Error{Kind: errForbidden, Resource: resource,
			Detail: "key " + strconv.Quote(p.Name) + " may not use this resource"}
	}
	return nil
}

// requiredRole is the least role a request needs. Every method but GET and
// HEAD changes something and needs a worker at least; revoking needs an
// admin (RevokeLease checks it again).
func requiredRole(r *http.Request) Role {
	path := r.URL.Path
	switch {
	case strings.HasPrefix(path, "/v1/leases/") && strings.HasSuffix(path, "/revoke"):
		return RoleAdmin
	case strings.HasPrefix(path, proxyPrefix):
		return RoleWorker
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		return RoleWorker
	}
	return RoleViewer
}

// openPath: liveness and readiness probes need no key.
func openPath(path string) bool { return path == "/healthz" || path == "/readyz" }

// authenticate is the security middleware when Config.Auth is set: it
// identifies the caller (401), meters it (429), checks the route's role
// (403) and puts the Principal in the request's context.
func (g *Gateway) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		// HTTP Basic, which browsers cache and send on their own, only
		// where the dashboard needs it (hosts.go).
		basicOK := basicAllowed(r)
		p, err := g.cfg.Auth.Authenticate(r)
		if err == nil && !basicOK && isBasic(r) {
			p, err = nil, &tokens.Error{Kind: ErrUnauthenticated,
				Detail: "HTTP Basic is accepted only by the dashboard (reads under /ui/ and its live feed); this call takes Authorization: Bearer <key>"}
		}
		if err != nil {
			// Browsers prompt for Basic (the dashboard); API clients use
			// Bearer. A client that tried Bearer is only offered Bearer.
			h := w.Header()
			h.Add("WWW-Authenticate", `Bearer realm="fencegw"`)
			if basicOK && !strings.HasPrefix(strings.ToLower(r.Header.Get("Authorization")), "bearer ") {
				h.Add("WWW-Authenticate", `Basic realm="fencegw", charset="UTF-8"`)
			}
			if tokens.ErrorOf(err) == nil {
				err = &tokens.Error{Kind: ErrUnauthenticated,
					Detail: "a valid API key is required (Authorization: Bearer <key>)"}
			}
			writeProblem(w, r, g.log, err)
			return
		}
		if ok, wait := g.cfg.Auth.Allow(p); !ok {
			writeProblem(w, r, g.log, &tokens.Error{Kind: errRateLimited, RetryAfter: wait,
				Detail: "key " + strconv.Quote(p.Name) + " is over its request rate"})
			return
		}
		if need := requiredRole(r); p.Role < need {
			writeProblem(w, r, g.log, &tokens.Error{Kind: errForbidden,
				Detail: "key " + strconv.Quote(p.Name) + " has role " + p.Role.String() + "; this call needs " + need.String()})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// limitBody bounds how long reading r's body may take (slow clients hold a
// goroutine, and a fenced write's also holds its resource's shared lock):
// past d the connection's read fails, the body's Read returns an
// errBodyTimeout error (408 request_timeout) and the request ends. The
// deadline is lifted once the body is read, so that a slow upstream is
// bounded by the forward timeout alone. The returned guard tells whether the
// body ran out of time (nil if no deadline was set); lift lifts the write
// deadline at the end of the request, for the next request on the
// connection. A body that was not read to its end keeps its read deadline:
// net/http reads the rest before answering, and a slow client must not stall
// that either (the connection is then closed, not reused).
//
// Requests framed by Transfer-Encoding are answered with Connection: close
// by the framing middleware (framing.go).
func limitBody(w http.ResponseWriter, r *http.Request, d time.Duration) (guard *bodyGuard, lift func()) {
	rc := http.NewResponseController(w)
	lift = func() { _ = rc.SetWriteDeadline(time.Time{}) }
	if r.Body == nil || r.Body == http.NoBody || d <= 0 {
		return nil, lift
	}
	deadline := time.Now().Add(d)
	if rc.SetReadDeadline(deadline) != nil {
		return nil, func() {} // not a net/http connection (a test recorder)
	}
	guard = &bodyGuard{deadline: deadline, timeout: d}
	r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, guard: guard}
	return guard, lift
}

// errBodyTimeout: the client did not send its body within the body timeout
// (408 request_timeout).
var errBodyTimeout = errors.New("request body timeout")

// bodyGuard follows one request body's read deadline.
type bodyGuard struct {
	deadline time.Time
	timeout  time.Duration
	done     atomic.Bool // read to its end
	timedOut atomic.Bool // a read failed at the deadline
	// broken is the error of a read that failed by the client's fault (a
	// malformed chunked body, a connection closed mid-body), if any.
	broken atomic.Pointer[error]
}

// brokenBy returns the error that made the client's body unreadable (not
// its deadline, not its size limit), or nil.
func (b *bodyGuard) brokenBy() error {
	if b == nil {
		return nil
	}
	if e := b.broken.Load(); e != nil {
		return *e
	}
	return nil
}

// ranOut reports whether the body did not arrive in time: a read failed at
// the deadline, or, unless the forward timed out first (an upstream that
// stops reading the body is not the client's fault), the deadline passed
// before the body's end. The second covers the race in which net/http
// cancels the request's context on the failed read, and the reverse proxy
// returns, before the body's Read does.
func (b *bodyGuard) ranOut(forwardTimedOut bool) bool {
	if b == nil {
		return false
	}
	return b.timedOut.Load() || (!forwardTimedOut && !b.done.Load() && !time.Now().Before(b.deadline))
}

// err is the error of a body that ran out of time.
func (b *bodyGuard) err(cause error) error {
	return &tokens.Error{Kind: errBodyTimeout, Field: "body", Cause: cause,
		Detail: "the request body was not received within the body timeout of " + b.timeout.String()}
}

type deadlineBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	guard *bodyGuard
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		if !b.guard.done.Swap(true) {
			_ = b.rc.SetReadDeadline(time.Time{})
		}
	case err != nil && errors.Is(err, os.ErrDeadlineExceeded):
		b.guard.timedOut.Store(true)
		err = b.guard.err(err)
	case err != nil:
		var maxBytes *http.MaxBytesError
		if !errors.As(err, &maxBytes) && !errors.Is(err, http.ErrBodyReadAfterClose) {
			b.guard.broken.CompareAndSwap(nil, &err)
		}
	}
	return n, err
}
