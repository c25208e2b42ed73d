package gateway

// The reference road of the differential tests: httputil.ReverseProxy over
// the gateway's http.Transport, with the gateway's own Rewrite (rewrite),
// the answer of a keyed write recorded in its ModifyResponse and failures
// answered by forwardFailed. What the direct forward does is held to what
// this does, byte for byte at the upstream and at the client.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"time"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

type oracleKey struct{}

// useReverseProxy makes tg forward its admitted writes through the
// reference road instead of the direct forward.
func useReverseProxy(tg *testGateway) {
	g := tg.g
	forwardOf := func(r *http.Request) *forward { return r.Context().Value(oracleKey{}).(*forward) }
	p := &httputil.ReverseProxy{
		// Rewrite (not Director), so that a client cannot drop headers the
		// gateway adds via Connection (golang/go#53002).
		Rewrite: func(pr *httputil.ProxyRequest) {
			f := forwardOf(pr.In)
			if f.buffered != nil {
				pr.Out.Body = inMemoryBody(f.buffered)
			}
			h := wire.FieldsOf(pr.Out.Header)
			g.rewrite(pr, &h, f, new([4]string), false)
			pr.Out.Header = h.Header()
		},
		Transport: g.transport,
		ModifyResponse: func(resp *http.Response) error {
			f := forwardOf(resp.Request)
			f.status = resp.StatusCode
			return g.recordKeyed(resp.Request.Context(), f, resp)
		},
		BufferPool: g.buffers,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			g.forwardFailed(w, r, forwardOf(r), err, errors.Is(err, context.DeadlineExceeded) || errors.Is(r.Context().Err(), context.DeadlineExceeded))
		},
		ErrorLog: g.proxyLog,
	}
	g.forwardVia = func(w http.ResponseWriter, r *http.Request, f *forward) {
		f.deadline = time.Now().Add(g.cfg.ForwardTimeout)
		ctx, cancel := context.WithDeadline(r.Context(), f.deadline)
		defer cancel()
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { f.wroteRequest.Store(true) }})
		ctx = context.WithValue(ctx, oracleKey{}, f)
		if len(r.Header["Expect"]) > 0 {
			w = continueOnce{w}
		}
		p.ServeHTTP(w, r.WithContext(ctx))
	}
}

// inMemoryBody is a body the Transport recognises as in memory
// (io.NopCloser over a *bytes.Reader), so that it writes head and body
// together, as the engine does.
func inMemoryBody(b []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }

// continueOnce drops the upstream's 100 Continue that the reverse proxy
// forwards: with Expect: 100-continue the gateway's own server already
// sends one when the Transport starts reading the body, as the direct
// forward drops it (directHooks.Got1xx). Other 1xx (103 Early Hints) pass.
type continueOnce struct{ http.ResponseWriter }

func (w continueOnce) WriteHeader(code int) {
	if code == http.StatusContinue {
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController (flushes, deadlines) reach the
// connection's writer.
func (w continueOnce) Unwrap() http.ResponseWriter { return w.ResponseWriter }
