package gateway

import (
	"errors"
	"net/url"
	"strconv"
	"strings"

	"github.com/fencegw/fencegw/internal/failpoint"
	"github.com/fencegw/fencegw/tokens"
)

// Route bindings (docs/security.md, "Routes"). Without them any live lease
// may write anywhere under any upstream, and only an upstream that checks
// Fencing-Resource itself notices a lease for res:b writing to res:a's
// path. A Route binds a path pattern under an upstream to the resources
// whose leases may write there:
//
//	statements/accounts/{acct}/**=stmt:acct:{acct}
//	inventory/**=inventory/*
//
// An upstream with at least one route is bound: a write to it passes only
// if some route of the upstream matches its path and takes its lease's
// resource; any other write is refused with 403 resource_mismatch and
// recorded. Upstreams without routes take any lease.
//
// Pattern (the path below /v1/proxy/{upstream}, starting with '/'):
// segments separated by '/', each one of
//
//	literal   matched exactly, after percent-decoding the path's segment
//	{name}    any one non-empty segment, captured as name (its decoded
//	          value, which may not hold a '/' from %2F)
//	*         any one non-empty segment
//	**        any number of segments, even none; only as the last segment
//
// The query is not part of the path. Literals hold no '{', '}', '*', '%',
// '\', ',', controls or whitespace, and are not dot segments (such paths
// never get past the path rule). At most 8 variables, each named once.
//
// Resource template: resource-name characters and {name} references to the
// pattern's variables, optionally ending in '*' (any resource that starts
// with what comes before it). "stmt:acct:{acct}" takes exactly the account's
// resource; "inventory/*" every resource under inventory/.
//
// Matching walks the path and the lease's resource in place: no allocation
// unless a segment is percent-encoded.
type Route struct {
	upstream string
	spec     string // as given, for messages
	segs     []patSeg
	res      []resPart
	prefix   bool // the template ends in '*'
}

type segKind uint8

const (
	segLiteral segKind = iota
	segVar
	segStar
	segRest
)

type patSeg struct {
	kind segKind
	lit  string
	v    int // segVar: capture index
}

type resPart struct {
	lit string
	v   int // -1: lit
}

// maxRouteVars bounds a pattern's variables (captures live on the stack).
const maxRouteVars = 8

// Upstream is the name of the upstream the route is under.
func (r *Route) Upstream() string { return r.upstream }

// String is the route as given: upstream/pattern=resource.
func (r *Route) String() string { return r.spec }

// ParseRoute parses "UPSTREAM/PATTERN=RESOURCE", the form of --route:
// the upstream's name, the path pattern below it and the resource
// template, split at the first '/' and the last '='.
func ParseRoute(spec string) (*Route, error) {
	name, rest, ok := strings.Cut(spec, "/")
	eq := strings.LastIndexByte(rest, '=')
	if !ok || name == "" || eq < 0 {
		return nil, errors.New("want UPSTREAM/PATTERN=RESOURCE, like statements/accounts/{acct}/**=stmt:acct:{acct}")
	}
	return NewRoute(name, "/"+rest[:eq], rest[eq+1:])
}

// NewRoute compiles a route binding pattern under upstream to the resource
// template.
func NewRoute(upstream, pattern, resource string) (*Route, error) {
	r := &Route{upstream: upstream, spec: upstream + pattern + "=" + resource}
	if upstream == "" || strings.ContainsAny(upstream, "/?#% ") {
		return nil, errors.New("route: the upstream name must be non-empty, without / ? # % or spaces")
	}
	if !strings.HasPrefix(pattern, "/") {
		return nil, errors.New("route: the pattern must start with /")
	}
	if len(pattern) > 1024 {
		return nil, errors.New("route: the pattern is longer than 1024 bytes")
	}
	vars := map[string]int{}
	segs := strings.Split(pattern[1:], "/")
	for i, s := range segs {
		switch {
		case s == "**":
			if i != len(segs)-1 {
				return nil, errors.New("route: ** may only be the last segment of " + strconv.Quote(pattern))
			}
			r.segs = append(r.segs, patSeg{kind: segRest})
		case s == "*":
			r.segs = append(r.segs, patSeg{kind: segStar})
		case strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") && len(s) > 2:
			v := s[1 : len(s)-1]
			if !varName(v) {
				return nil, errors.New("route: variable " + strconv.Quote(v) + " must be a letter or _ followed by up to 31 letters, digits or _")
			}
			if _, dup := vars[v]; dup {
				return nil, errors.New("route: variable " + strconv.Quote(v) + " appears twice")
			}
			if len(vars) == maxRouteVars {
				return nil, errors.New("route: more than 8 variables")
			}
			vars[v] = len(vars)
			r.segs = append(r.segs, patSeg{kind: segVar, v: vars[v]})
		default:
			if strings.ContainsAny(s, "{}*%\\,") || dotSegment(s) || hasControlOrSpace(s) {
				return nil, errors.New("route: segment " + strconv.Quote(s) + " of " + strconv.Quote(pattern) +
					" is not a literal, {name}, * or ** (literals hold no { } * % \\ , controls or spaces and are not dot segments)")
			}
			r.segs = append(r.segs, patSeg{kind: segLiteral, lit: s})
		}
	}

	t := resource
	if strings.HasSuffix(t, "*") {
		r.prefix, t = true, t[:len(t)-1]
	}
	if t == "" && !r.prefix {
		return nil, errors.New("route: the resource template is empty")
	}
	if len(t) > tokens.DefaultLimits.MaxResource {
		return nil, errors.New("route: the resource template is longer than a resource name may be")
	}
	for t != "" {
		open := strings.IndexByte(t, '{')
		if open < 0 {
			open = len(t)
		}
		if lit := t[:open]; lit != "" {
			for i := 0; i < len(lit); i++ {
				if !tokens.ResourceByte(lit[i]) {
					return nil, errors.New("route: the resource template " + strconv.Quote(resource) +
						" may hold only A-Z a-z 0-9 . _ : @ / -, {name} and a final *")
				}
			}
			r.res = append(r.res, resPart{lit: lit, v: -1})
		}
		if open == len(t) {
			break
		}
		end := strings.IndexByte(t[open:], '}')
		if end < 0 {
			return nil, errors.New("route: unclosed { in the resource template " + strconv.Quote(resource))
		}
		name := t[open+1 : open+end]
		v, ok := vars[name]
		if !ok {
			return nil, errors.New("route: the resource template uses {" + name + "}, which the pattern does not capture")
		}
		r.res = append(r.res, resPart{v: v})
		t = t[open+end+1:]
	}
	return r, nil
}

func varName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func hasControlOrSpace(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return true
		}
	}
	return false
}

// match reports whether raw, the escaped path below the upstream (already
// through the path rule), matches the pattern, with its captures.
func (r *Route) match(raw string, caps *[maxRouteVars]string) bool {
	if !strings.HasPrefix(raw, "/") {
		return false
	}
	rest := raw[1:]
	more := true // a segment is left in rest (raw always has at least one)
	for _, ps := range r.segs {
		if ps.kind == segRest {
			return true
		}
		if !more {
			return false
		}
		seg := rest
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			seg, rest = rest[:i], rest[i+1:]
		} else {
			rest, more = "", false
		}
		if strings.IndexByte(seg, '%') >= 0 {
			dec, err := url.PathUnescape(seg)
			if err != nil {
				return false
			}
			if ps.kind == segVar && strings.IndexByte(dec, '/') >= 0 {
				return false // an encoded '/': upstreams disagree on where the segment ends
			}
			seg = dec
		}
		switch ps.kind {
		case segLiteral:
			if seg != ps.lit {
				return false
			}
		case segVar:
			if seg == "" {
				return false
			}
			caps[ps.v] = seg
		case segStar:
			if seg == "" {
				return false
			}
		}
	}
	return !more
}

// takes reports whether the template, with caps, takes resource.
func (r *Route) takes(resource string, caps *[maxRouteVars]string) bool {
	for _, p := range r.res {
		want := p.lit
		if p.v >= 0 {
			want = caps[p.v]
		}
		if !strings.HasPrefix(resource, want) {
			return false
		}
		resource = resource[len(want):]
	}
	return resource == "" || r.prefix
}

// Allows reports whether a write to raw (the escaped path below the
// route's upstream) under a lease for resource passes this route.
func (r *Route) Allows(raw, resource string) bool {
	var caps [maxRouteVars]string
	return r.match(raw, &caps) && r.takes(resource, &caps)
}

// routeTable holds each bound upstream's routes.
type routeTable map[string][]*Route

func newRouteTable(routes []*Route) routeTable {
	if len(routes) == 0 {
		return nil
	}
	t := routeTable{}
	for _, r := range routes {
		if r != nil && r.upstream != "" {
			t[r.upstream] = append(t[r.upstream], r)
		}
	}
	return t
}

// check refuses a write under a lease for resource to raw below upstream
// if the upstream is bound and no route of it takes the lease there.
func (t routeTable) check(upstream, raw, resource string, token int64) error {
	routes := t[upstream]
	if len(routes) == 0 || failpoint.SkipRouteCheck {
		return nil
	}
	var caps [maxRouteVars]string
	var matched *Route
	for _, r := range routes {
		if r.match(raw, &caps) {
			if r.takes(resource, &caps) {
				return nil
			}
			if matched == nil {
				matched = r
			}
		}
	}
	detail := "no route of upstream " + strconv.Quote(upstream) + " covers this path, so no lease may write here"
	if matched != nil {
		detail = "the lease is for " + strconv.Quote(resource) + ", which route " + strconv.Quote(matched.spec) + " does not take"
	}
	return &tokens.Error{Kind: tokens.ErrResourceMismatch, Resource: resource, Token: token,
		Detail: detail + "; nothing was forwarded"}
}
