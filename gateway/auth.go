package gateway

// Authentication and authorisation of the gateway's callers: the
// principal a key names, the role each path needs, and the middleware.

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fencegw/fencegw/auth"
	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// Role and Principal are auth's (auth.Role, auth.Principal): the keys file
// makes them, and auth does not import the gateway that checks them.
type (
	// Role is what an authenticated principal may do (auth.Role).
	Role = auth.Role
	// Principal is an authenticated caller: one API key (auth.Principal).
	Principal = auth.Principal
)

// Roles, lowest first (auth's).
const (
	RoleViewer = auth.RoleViewer
	RoleWorker = auth.RoleWorker
	RoleAdmin  = auth.RoleAdmin
)

// Authenticator identifies callers and meters them. Config.Auth nil means
// no authentication: every caller may do everything.
type Authenticator interface {
	// Authenticate returns the caller of r, or an error wrapping
	// ErrUnauthenticated (no key, an unknown key, a malformed header).
	Authenticate(r *http.Request) (*Principal, error)
	// Allow takes one request from p's rate budget in this process. When
	// none is left it returns false and how long until there is one. With
	// Config.Rates, a key with a rate is metered there instead, and Allow
	// only when the store does not answer (ratelimit.go).
	Allow(p *Principal) (ok bool, retryAfter time.Duration)
}

// ErrUnauthenticated: no API key, or not a valid one
// (auth.ErrUnauthenticated). The security checks' other refusals are
// internal/problems' ErrForbidden and ErrRateLimited; a key's lease cap is
// the store's (tokens.ErrTooManyLeases).
var ErrUnauthenticated = auth.ErrUnauthenticated

// principalFrom returns the authenticated caller, or nil without
// authentication (the request's scope holds it: live.go).
func principalFrom(ctx context.Context) *Principal {
	if s, ok := ctx.Value(scopeKey{}).(*scope); ok {
		return s.principal
	}
	return nil
}

// principalName is the caller's name, "" without authentication (which
// skips the lease-ownership checks).
func principalName(ctx context.Context) string { return nameOf(principalFrom(ctx)) }

// nameOf is principalName for the caller p (nil: no authentication).
func nameOf(p *Principal) string {
	if p != nil {
		return p.Name
	}
	return ""
}

// mayUse checks the caller's resource prefixes (always true without
// authentication).
func mayUse(ctx context.Context, resource string) error {
	return mayUseAs(principalFrom(ctx), resource)
}

// mayUseAs is mayUse for the caller p (nil: no authentication).
func mayUseAs(p *Principal, resource string) error {
	if p != nil && !p.MayUse(resource) {
		return &tokens.Error{Kind: problems.ErrForbidden, Resource: resource,
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

// authenticate is the security middleware: when the live configuration
// the request is judged under has keys, it identifies the caller (401),
// meters it (429), checks the route's role (403) and puts the Principal in
// the request's scope.
func (g *Gateway) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, s := g.withScope(r)
		keys := s.live.auth
		if keys == nil || keyless(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		// HTTP Basic, which browsers cache and send on their own, only
		// where the dashboard needs it (hosts.go).
		basicOK := basicAllowed(r)
		p, err := keys.Authenticate(r)
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
		if ok, wait := g.allow(r.Context(), keys, p); !ok {
			writeProblem(w, r, g.log, &tokens.Error{Kind: problems.ErrRateLimited, RetryAfter: wait,
				Detail: "key " + strconv.Quote(p.Name) + " is over its request rate"})
			return
		}
		if need := requiredRole(r); p.Role < need {
			err := &tokens.Error{Kind: problems.ErrForbidden,
				Detail: "key " + strconv.Quote(p.Name) + " has role " + p.Role.String() + "; this call needs " + need.String()}
			if strings.HasPrefix(r.URL.Path, proxyPrefix) {
				g.recordForbiddenWrite(r, p, err)
			}
			writeProblem(w, r, g.log, err)
			return
		}
		s.principal = p
		next.ServeHTTP(w, r)
	})
}

// recordForbiddenWrite records a fenced write refused because its key's
// role may not write (a viewer's), under the lease it presented, as every
// refused write is recorded (DESIGN.md, guarantee 5): the rejection log
// then shows which principal tried to write with whose lease. A write
// without a lease is answered 403 and not recorded, as a worker's would be
// answered 400 missing_lease and not recorded.
func (g *Gateway) recordForbiddenWrite(r *http.Request, p *Principal, refusal error) {
	leaseID := r.Header.Get(HeaderLease)
	if leaseID == "" {
		return
	}
	name, path := strings.TrimPrefix(r.URL.Path, proxyPrefix), "/"
	if i := strings.IndexByte(name, '/'); i >= 0 {
		name, path = name[:i], name[i:]
	}
	write := tokens.Write{Method: r.Method, Upstream: truncateUTF8(name, 64), Path: truncateUTF8(path, 512), Principal: p.Name}
	err := g.svc.RefuseUnadmitted(r.Context(), leaseID, refusal, write)
	g.metrics.refused(r.Context(), err)
	g.metrics.refusedBy(write.Principal, err)
}
