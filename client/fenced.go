package client

// Fenced writes: a lease's Do, HTTPClient and Transport, which send a
// request through the gateway's proxy under the lease.

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// HeaderLease carries the lease id of a fenced write to the gateway.
const HeaderLease = "Fencing-Lease"

// Do sends req to an upstream through the gateway as a fenced write under
// the lease. The upstream is named by req.URL's host, as configured in the
// gateway (`--upstream statements=...`): a request for
// http://statements/accounts/88213/lines goes to the gateway's
// /v1/proxy/statements/accounts/88213/lines, which forwards it to the
// upstream's /accounts/88213/lines only if this lease is the resource's
// current one. The URL's scheme and port are ignored.
//
// The upstream's answers come back as they are, errors included (an
// upstream's own 409 is a response, not an error). The gateway's own
// problem answers become an *Error (wrapped in a *url.Error, as
// http.Client does): ErrStale (the write did not reach the upstream; the
// lease is marked lost, Done closes), ErrUnavailable (503, or no answer:
// then whether the write was forwarded is unknown), ErrUpstream (502/504:
// the upstream failed; after a timeout the write may still land), or a bare
// *Error (unknown_upstream, missing_lease, body_too_large, ...).
//
// Do sends the write even if the lease is already known to be lost: the
// gateway decides, and records the refusal where operators see it.
func (l *Lease) Do(req *http.Request) (*http.Response, error) {
	return l.HTTPClient("").Do(req)
}

// HTTPClient returns an *http.Client whose requests are fenced writes under
// the lease to upstream (see Do), whatever their URL's scheme and host:
// code written against the upstream's own address works unchanged. An empty
// upstream takes the name from each request's host. It uses the Client's
// HTTP client's Transport, Timeout and CheckRedirect.
func (l *Lease) HTTPClient(upstream string) *http.Client {
	return &http.Client{
		Transport:     l.Transport(upstream),
		Timeout:       l.c.hc.Timeout,
		CheckRedirect: l.c.hc.CheckRedirect,
	}
}

// Transport returns an http.RoundTripper that sends every request as a
// fenced write under the lease to upstream (see Do and HTTPClient). Its
// RoundTrip returns the gateway's problem answers as *Error.
func (l *Lease) Transport(upstream string) http.RoundTripper {
	base := l.c.hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	return &fencedTransport{lease: l, upstream: upstream, base: base}
}

type fencedTransport struct {
	lease    *Lease
	upstream string
	base     http.RoundTripper
}

var errNoUpstream = errors.New("fencegw: no upstream: name it as the request URL's host (http://statements/...) or use Transport(upstream)")

func (t *fencedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	upstream := t.upstream
	if upstream == "" {
		upstream = req.URL.Hostname()
	}
	if upstream == "" {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, errNoUpstream
	}
	out := req.Clone(req.Context())
	out.URL = t.lease.c.proxyURL(upstream, req.URL)
	out.Host = ""
	out.Header.Set(HeaderLease, t.lease.id)
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		return nil, transportError(OpWrite, err)
	}
	return t.lease.checkAnswer(resp)
}

// proxyURL is the gateway's URL for a fenced request to upstream at in's
// path and query.
func (c *Client) proxyURL(upstream string, in *url.URL) *url.URL {
	p := in.EscapedPath()
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	u := *c.base
	u.RawPath = c.base.EscapedPath() + "/v1/proxy/" + url.PathEscape(upstream) + p
	if path, err := url.PathUnescape(u.RawPath); err == nil {
		u.Path = path
	} else {
		u.Path = u.RawPath
	}
	u.RawQuery = in.RawQuery
	return &u
}

// checkAnswer turns the gateway's own problem answers into errors and
// passes everything else, the upstream's problems included, through.
func (l *Lease) checkAnswer(resp *http.Response) (*http.Response, error) {
	if resp.StatusCode < 400 || !isProblemContentType(resp.Header) {
		return resp, nil
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxProblemBody+1))
	if err != nil {
		_ = resp.Body.Close()
		return nil, transportError(OpWrite, err)
	}
	if len(head) <= maxProblemBody {
		if e, ok := gatewayProblem(OpWrite, resp.StatusCode, resp.Header, head); ok {
			_ = resp.Body.Close()
			if errors.Is(e, ErrStale) {
				l.lose(e)
			}
			return nil, e
		}
	}
	resp.Body = &rereadBody{Reader: io.MultiReader(bytes.NewReader(head), resp.Body), Closer: resp.Body}
	return resp, nil
}

// rereadBody gives back a body whose start was read to inspect it.
type rereadBody struct {
	io.Reader
	io.Closer
}
