package gateway

// Request trailers: the trailer fields of a chunked fenced write go on to
// the upstream (RFC 9112 7.1.2 lets a recipient that removes the chunked
// coding keep them; RFC 9110 6.5 has an intermediary forward what it does
// not process), held to the same rules as the header: what the gateway
// drops or sets in the header is dropped from the trailer too, so that a
// trailer cannot carry a Fencing-Token, a forwarding fact or the
// upstream's credential header past them, nor a hop-by-hop or framing
// field.
//
// Go's server reads a request's trailer only when its body reaches EOF,
// and then fills the request's Trailer map (creating it if the client
// announced none, on the request it parsed: the handlers' shallow copies
// never see it). So keepTrailer gives every chunked request a map before
// anything copies the request, and trailerBody copies the allowed fields
// into the outbound request's own map when the client's body ends, which
// is before http.Transport writes the trailer section from that map.

import (
	"io"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// keepTrailer makes r's Trailer map one that all copies of r share, so
// that trailer fields the client did not announce are seen by the
// forward. r must be the request as Go's server made it.
func keepTrailer(r *http.Request) {
	if r.Trailer == nil && len(r.TransferEncoding) > 0 {
		r.Trailer = http.Header{}
	}
}

// forwardTrailer prepares pr.Out, about to be sent with a chunked body, to
// carry the trailer fields of pr.In that may go on: the announced ones are
// announced (the Transport writes Trailer from the map's keys), and all
// of them are copied in when the body ends.
func (g *Gateway) forwardTrailer(out, in *http.Request, upstream string) {
	out.Trailer = nil
	if in.Trailer == nil || out.Body == nil || out.Body == http.NoBody || out.ContentLength != -1 {
		return // no chunked body, so no trailer (a keyed write's body was read whole)
	}
	keep := g.trailerRule(in.Header, upstream)
	t := http.Header{}
	for k := range in.Trailer {
		if keep(k) {
			t[k] = nil
		}
	}
	out.Trailer = t
	out.Body = &trailerBody{ReadCloser: out.Body, in: in, out: t, keep: keep}
}

// trailerRule returns whether a trailer field named k goes on: a valid
// field name that is not hop-by-hop (nor named by the client's
// Connection), not a framing or routing field, and none of the names the
// header rules drop or set (rewrite).
func (g *Gateway) trailerRule(h http.Header, upstream string) func(k string) bool {
	named := map[string]bool{}
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				named[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	own := g.cfg.UpstreamHeaders[upstream]
	return func(k string) bool {
		if !validFieldName(k) {
			return false
		}
		k = http.CanonicalHeaderKey(k)
		if named[k] || strings.HasPrefix(k, "Fencing-") || strings.HasPrefix(k, "X-Forwarded-") {
			return false
		}
		switch k {
		case "Forwarded", "X-Real-Ip", "Content-Length", "Host", "Proxy-Connection":
			return false
		case "Authorization":
			if g.cfg.Auth != nil {
				return false
			}
		}
		for _, hop := range wire.HopHeaders {
			if k == hop {
				return false
			}
		}
		for name := range own {
			if strings.EqualFold(k, name) {
				return false
			}
		}
		return true
	}
}

// trailerBody is the outbound body of a chunked write: at the client's
// body's end it copies the trailer fields that may go on into out, the
// outbound request's Trailer, which the Transport writes after the last
// chunk.
type trailerBody struct {
	io.ReadCloser
	in   *http.Request // its Trailer is filled when its body ends
	out  http.Header
	keep func(string) bool
	done bool
}

func (b *trailerBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		for k, vv := range b.in.Trailer {
			if len(vv) > 0 && b.keep(k) {
				b.out[k] = vv
			}
		}
	}
	return n, err
}

// validFieldName reports whether k is a field name (RFC 9110 5.1: a
// token); Go's server takes trailer lines whose names are not.
func validFieldName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
