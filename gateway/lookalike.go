package gateway

// Look-alike header names on fenced writes.
//
// Go keeps `Fencing_Token` apart from `Fencing-Token`, and so do the
// gateway's header rules (rewrite drops client-sent Fencing-*, the hop-by-hop
// headers are removed by name). CGI and WSGI servers (Python's wsgiref,
// PHP, Django's META) and nginx with underscores_in_headers do not: they
// fold `_` into `-` (HTTP_FENCING_TOKEN), so a look-alike forwarded next to
// the gateway's own would let a worker choose the token the resource checks.
// A fenced write carrying a name that folds (ASCII case, `_` for `-`) into
// one the gateway sets, drops or treats as hop-by-hop is refused before
// anything else is done with it: 400 invalid_request naming the header.

import (
	"net/http"
	"strings"

	"github.com/fencegw/fencegw/tokens"
)

// foldedProtected are the names (folded: lower case, '-' for '_') whose
// look-alikes are refused: the framing and hop-by-hop fields, and what the
// gateway sets or drops (rewrite). Fencing-*, X-Forwarded-* are refused as
// prefixes. Names without a '-' (Connection, Upgrade, TE, Trailer,
// Forwarded, Authorization) have no look-alike: Go already folds case.
var foldedProtected = []string{
	"content-length", "transfer-encoding", "keep-alive", "proxy-connection",
	"proxy-authorization", "proxy-authenticate", "x-real-ip",
}

// lookalikeHeader returns the first header name in h that is not the name
// Go's own rules see but folds into a protected one, or "".
func lookalikeHeader(h http.Header) string {
	for k := range h {
		if lookalikeName(k) {
			return k
		}
	}
	return ""
}

// lookalikeName reports whether the header name k (as Go keys it) folds
// into a protected name it is not.
func lookalikeName(k string) bool {
	// Without a '_', k is Go's canonical form: the header rules see it as is.
	return strings.IndexByte(k, '_') >= 0 && protectedFold(k)
}

// protectedFold reports whether name, folded, is protected.
func protectedFold(name string) bool {
	if foldedPrefix(name, "fencing-") || foldedPrefix(name, "x-forwarded-") {
		return true
	}
	for _, p := range foldedProtected {
		if len(name) == len(p) && foldedPrefix(name, p) {
			return true
		}
	}
	return false
}

// foldedPrefix reports whether name starts with p (lower case, with '-')
// once folded: ASCII case ignored, '_' taken for '-'.
func foldedPrefix(name, p string) bool {
	if len(name) < len(p) {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := name[i]
		switch {
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		case c == '_':
			c = '-'
		}
		if c != p[i] {
			return false
		}
	}
	return true
}

// lookalikeError refuses a fenced write carrying the look-alike name.
func lookalikeError(name string) error {
	return tokens.Invalid(truncate(name, 64), "a header name that CGI and WSGI servers read as one the gateway sets or removes ('_' for '-'); nothing was forwarded")
}

// upstreamLookalike returns a header name in h that folds into one of
// set's (the upstream's configured headers, which replace the client's
// under their own names only), or "".
func upstreamLookalike(h http.Header, set http.Header) string {
	if len(set) == 0 {
		return "" // most upstreams have none: no pass over the client's fields
	}
	for k := range h {
		if strings.IndexByte(k, '_') < 0 {
			continue
		}
		for name := range set {
			if len(k) == len(name) && foldedPrefix(k, strings.ToLower(name)) {
				return k
			}
		}
	}
	return ""
}
