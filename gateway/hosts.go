package gateway

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// Browser defences (docs/security.md, "Browsers"). A page in a browser on
// the gateway's machine, or on a machine that reaches it, can send
// requests to it: simple cross-site requests (a form POST, a fetch without
// custom headers) and, through DNS rebinding, same-origin requests under a
// name the attacker controls. The gateway therefore
//
//   - refuses requests whose Host is not one of its own names
//     (Config.AllowedHosts): a rebinding page's requests carry the
//     attacker's name;
//   - needs Content-Type: application/json on control calls with a body
//     (controlBody), which a cross-site page cannot send without a CORS
//     preflight, and the gateway grants none; fenced writes need the
//     Fencing-Lease header, which needs one too;
//   - refuses cross-origin state-changing requests from browsers outright
//     (Sec-Fetch-Site, Origin: net/http's CrossOriginProtection);
//   - accepts HTTP Basic, the credentials a browser caches and sends on its
//     own, only where the dashboard needs it (basicAllowed): reads under
//     /ui/ and its live feed. The API takes bearer keys.

// hostList is a precompiled Config.AllowedHosts.
type hostList struct {
	names []string // lower case, without port or brackets
	any   bool     // no check (empty list, or "*")
}

func newHostList(allowed []string) hostList {
	if len(allowed) == 0 {
		return hostList{any: true}
	}
	var l hostList
	for _, h := range allowed {
		if h == "*" {
			return hostList{any: true}
		}
		l.names = append(l.names, strings.ToLower(strings.TrimSuffix(hostOnly(h), ".")))
	}
	return l
}

// hostOnly strips the port and IPv6 brackets from a Host value, without
// allocating.
func hostOnly(h string) string {
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			return h[1:i]
		}
		return h
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 && strings.IndexByte(h, ':') == i {
		return h[:i]
	}
	return h
}

func (l hostList) allows(host string) bool {
	if l.any {
		return true
	}
	h := strings.TrimSuffix(hostOnly(host), ".")
	for _, n := range l.names {
		// A name as the list has it (lower case, as clients send names)
		// is found without EqualFold's fold of each byte: 90
		// instructions fewer for "127.0.0.1".
		if h == n || strings.EqualFold(h, n) {
			return true
		}
	}
	return false
}

// LoopbackHosts are the names a loopback gateway answers to by default.
var LoopbackHosts = []string{"localhost", "127.0.0.1", "::1"}

// DefaultAllowedHosts is the Host allow-list for a gateway listening on
// listen without configured names: the loopback names and the listen
// address's host, if listen is a loopback address; nil (no check) if it is
// not, since the names clients use are then unknown.
func DefaultAllowedHosts(listen string) []string {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return nil
	}
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil
	}
	names := append([]string(nil), LoopbackHosts...)
	if !slices.Contains(names, host) {
		names = append(names, host)
	}
	return names
}

// browserGuard is the middleware of the first and third defence above.
// Probes (/healthz, /readyz) are exempt from the Host check: a load
// balancer's health check names an address, and they disclose nothing.
func (g *Gateway) browserGuard(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.liveOf(r).hosts.allows(r.Host) && !openPath(r.URL.Path) {
			g.refuseBrowser(w, r, &tokens.Error{Kind: problems.ErrForbidden, Field: "Host",
				Detail: strconv.Quote(truncateUTF8(r.Host, 128)) + " is not one of this gateway's names (--allowed-hosts); nothing was done"})
			return
		}
		// Fenced writes need a Fencing-Lease header, which no cross-site
		// page can send without a preflight: their hot path skips this.
		if !strings.HasPrefix(r.URL.Path, proxyPrefix) {
			if err := cop.Check(r); err != nil {
				g.refuseBrowser(w, r, &tokens.Error{Kind: problems.ErrForbidden, Field: "Origin",
					Detail: "a cross-origin request from a browser may not change anything here; nothing was done"})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (g *Gateway) refuseBrowser(w http.ResponseWriter, r *http.Request, err error) {
	if strings.HasPrefix(r.URL.Path, proxyPrefix) {
		g.metrics.write(outcomeBadRequest)
	}
	writeProblem(w, r, g.log, err)
}

// basicAllowed reports whether r may authenticate with HTTP Basic: the
// dashboard's reads (under /ui/, the redirects to it, its live feed).
// Everything else takes Authorization: Bearer.
func basicAllowed(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	p := r.URL.Path
	return p == "/" || p == "/ui" || strings.HasPrefix(p, "/ui/") || p == "/v1/rejections/stream"
}

// isBasic reports whether r's Authorization uses the Basic scheme.
func isBasic(r *http.Request) bool {
	for _, v := range r.Header["Authorization"] {
		if len(v) >= 6 && strings.EqualFold(v[:6], "basic ") {
			return true
		}
	}
	return false
}
