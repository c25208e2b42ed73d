package wire

import (
	"net/http"
	"net/textproto"
	"strings"
)

// HopHeaders are the hop-by-hop fields (RFC 9110 7.6.1): removed from
// requests and answers alike, with those a Connection field names (the
// reverse proxy's removeHopByHopHeaders). They are here, not in the
// gateway, because the engine removes them too from an answer it reads
// straight into the client's header (package engine, readHead).
var HopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// IsHopHeader reports whether k (canonical) is one of HopHeaders.
func IsHopHeader(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// RemoveHopByHop removes from h the fields its Connection field names,
// then the hop-by-hop fields, as the reverse proxy does.
func RemoveHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	if len(h) < len(HopHeaders) {
		// Fewer fields than hop-by-hop names (an answer's header, most
		// requests'): one pass over the fields instead of a lookup of
		// each name.
		for k := range h {
			if IsHopHeader(k) {
				delete(h, k)
			}
		}
		return
	}
	for _, f := range HopHeaders {
		delete(h, f)
	}
}
