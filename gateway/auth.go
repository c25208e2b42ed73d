package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
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

// keyless: the probes, and the OpenAPI document, which is published with
// the source and discloses nothing a key protects; generators and API
// tools fetch it before they have one. The document still answers only
// under the gateway's own names (browserGuard).
func keyless(path string) bool {
	return openPath(path) || path == "/v1/openapi.yaml" || path == "/v1/openapi.json"
}

// authenticate is the security middleware when Config.Auth is set: it
// identifies the caller (401), meters it (429), checks the route's role
// (403) and puts the Principal in the request's context.
func (g *Gateway) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if keyless(r.URL.Path) {
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
