package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sync"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// The part of the configuration that changes while the gateway runs
// (Reload): upstreams and their credentials, routes, observed upstreams,
// allowed hosts and API keys. It lives behind one atomic pointer. Each
// request loads it once, where it enters the gateway (dispatch), and is
// judged wholly under that one: the Host check, the key, the upstream, the
// route and observation. A write in flight keeps the one that admitted it
// to its end (the forward holds it); a key removed by a reload fails on
// its next request, since that request loads the new one.

// Live is the part of Config that Reload replaces, as a whole.
type Live struct {
	Upstreams       map[string]*url.URL
	UpstreamHeaders map[string]http.Header
	// Auth nil: no authentication.
	Auth         Authenticator
	AllowedHosts []string
	Routes       []*Route
	Observe      map[string]bool
}

// live is a Live compiled for the request path.
type live struct {
	upstreams map[string]*url.URL
	headers   map[string]http.Header
	auth      Authenticator
	hosts     hostList
	bindings  routeTable
	observe   map[string]bool
	gen       uint64 // counts reloads, for tests and logs
}

// compileLive checks l and compiles it: every route, observed upstream and
// set of upstream credentials must name a configured upstream.
func compileLive(l Live) (*live, error) {
	if err := checkLive(l); err != nil {
		return nil, err
	}
	return buildLive(l), nil
}

func checkLive(l Live) error {
	for _, r := range l.Routes {
		if r == nil {
			return fmt.Errorf("a nil route")
		}
		if _, ok := l.Upstreams[r.Upstream()]; !ok {
			return fmt.Errorf("route %s: upstream %q is not configured", r, r.Upstream())
		}
	}
	for name, on := range l.Observe {
		if _, ok := l.Upstreams[name]; on && !ok {
			return fmt.Errorf("observe: upstream %q is not configured", name)
		}
	}
	for name := range l.UpstreamHeaders {
		if _, ok := l.Upstreams[name]; !ok {
			return fmt.Errorf("credentials for upstream %q, which is not configured", name)
		}
	}
	return nil
}

// buildLive compiles l unchecked (New takes its Config as given).
func buildLive(l Live) *live {
	obs := map[string]bool{}
	for name, on := range l.Observe {
		if on {
			obs[name] = true
		}
	}
	if len(obs) == 0 {
		obs = nil
	}
	return &live{upstreams: l.Upstreams, headers: l.UpstreamHeaders, auth: l.Auth,
		hosts: newHostList(slices.Clone(l.AllowedHosts)), bindings: newRouteTable(l.Routes), observe: obs}
}

// Reload replaces the live configuration as a whole, after checking it:
// requests that start after it returns are judged under l; those already
// started finish under the one they loaded. On an error nothing changes.
// Either way it is counted in fencegw_config_reloads_total.
func (g *Gateway) Reload(l Live) error {
	lc, err := compileLive(l)
	if err != nil {
		g.ReloadRefused()
		return err
	}
	defer g.metrics.reloads[true].Inc()
	for {
		old := g.live.Load()
		lc.gen = old.gen + 1
		if g.live.CompareAndSwap(old, lc) {
			return nil
		}
	}
}

// ReloadRefused counts a reload refused before it reached Reload (a
// configuration file that does not parse, a certificate that does not
// load): the configuration stays as it was.
func (g *Gateway) ReloadRefused() { g.metrics.reloads[false].Inc() }

// Generation counts the reloads applied (0: the configuration New was given).
func (g *Gateway) Generation() uint64 { return g.live.Load().gen }

// scope is a request's own state, put in its context once by the framing
// middleware (or by dispatch, for a request that did not go through it):
// the live configuration it is judged under, and its caller once
// authenticate knows it. It is the context itself (no allocation of its
// own: part of the framing middleware's requestState).
type scope struct {
	context.Context
	live      *live
	principal *Principal
	// write is the storage of the state of the request's fenced write
	// (newForward), nil where the scope was made without it (withScope).
	write *forward
	// done is the parent's Done, found at the first call (doneOnce): each
	// call through the embedded context walks the server's layers of
	// values to it, twice a fenced write. Not at the scope's making: a
	// context of Go's server makes its channel when first asked for it.
	done     <-chan struct{}
	doneOnce sync.Once
	// neverDone: the parent's Done is known to be nil
	// (framing.Verdict.NeverDone), set before the scope is shared.
	neverDone bool
	// sent is the request's header fields in the order the client sent
	// them, where the listener's own loop parsed its head
	// (framing.Verdict.Fields); nil otherwise.
	sent []wire.Field
	// answer is the list the request's answer's fields may be listed in,
	// beside its header map (framing.Verdict.Answer); nil: none.
	answer *wire.Fields
}

// sentFields is s.sent; nil for a nil scope.
func (s *scope) sentFields() []wire.Field {
	if s == nil {
		return nil
	}
	return s.sent
}

// answerFields is s.answer; nil for a nil scope.
func (s *scope) answerFields() *wire.Fields {
	if s == nil {
		return nil
	}
	return s.answer
}

// Done is the request's context's Done.
func (s *scope) Done() <-chan struct{} {
	if s.neverDone {
		return nil
	}
	s.doneOnce.Do(s.findDone)
	return s.done
}

func (s *scope) findDone() { s.done = s.Context.Done() }

type scopeKey struct{}

// caller is the scope's principal, nil without authentication or scope.
func (s *scope) caller() *Principal {
	if s != nil {
		return s.principal
	}
	return nil
}

// Value finds the scope without a separate context layer. The key is
// told by its type alone (a comparison of the interface with scopeKey{}
// called the runtime's equality, seven times a fenced write).
func (s *scope) Value(key any) any {
	if _, ok := key.(scopeKey); ok {
		return s
	}
	return s.Context.Value(key)
}

// withScope gives r a scope under the current live configuration, unless
// it has one.
func (g *Gateway) withScope(r *http.Request) (*http.Request, *scope) {
	if s, ok := r.Context().Value(scopeKey{}).(*scope); ok {
		return r, s
	}
	b := new(requestBase)
	return g.scopeInto(r, &b.scope, &b.req), &b.scope
}

// scopeInto gives r the scope s under the current live configuration: a
// copy of r, made in into (s and into are the caller's storage, unused
// until then, in one allocation with the request's other state).
func (g *Gateway) scopeInto(r *http.Request, s *scope, into *http.Request) *http.Request {
	*s = scope{Context: r.Context(), live: g.live.Load()}
	*into = *r.WithContext(s) // WithContext's own copy stays on the stack
	return into
}

// liveOf is the live configuration r is judged under: its scope's, or (a
// handler called without dispatch, in tests) the current one.
func (g *Gateway) liveOf(r *http.Request) *live { return g.liveIn(scopeOf(r)) }

// liveIn is liveOf for r's scope s (nil: none).
func (g *Gateway) liveIn(s *scope) *live {
	if s != nil {
		return s.live
	}
	return g.live.Load()
}

// scopeOf is r's scope, nil if it has none. A handler that asks it
// several things looks it up once: each lookup through the context cost
// about 40 instructions.
func scopeOf(r *http.Request) *scope {
	s, _ := r.Context().Value(scopeKey{}).(*scope)
	return s
}
