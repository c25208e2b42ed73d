package gateway

// Tracing: spans by hand rather than otelhttp's handler and transport, so
// that a gateway without a TracerProvider (the default) runs no tracing
// code at all on the write path: no wrapped ResponseWriter, no extracted
// context, no span, only nil checks. With one, every request gets a server
// span continuing the client's W3C traceparent; acquire, renew and release
// name theirs, and a fenced write's has three children: admission (the
// lease checks), wait (the shared lock, inside admission, through
// tokens.Config.OnLockWait) and forward (the upstream exchange, whose
// context the upstream receives as its traceparent). Spans carry the
// resource, the token, the outcome and the problem code; never the lease
// id, a bearer secret.

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegw/fencegw/gateway/internal/wire"
	"github.com/fencegw/fencegw/tokens"
)

// tracerName is the instrumentation scope of the gateway's spans.
const tracerName = "github.com/fencegw/fencegw/gateway"

// Span attribute keys of the gateway's own facts.
const (
	attrResource = attribute.Key("fencegw.resource")
	attrToken    = attribute.Key("fencegw.token")
	attrOutcome  = attribute.Key("fencegw.outcome")
	attrCode     = attribute.Key("fencegw.code") // the problem code
	attrUpstream = attribute.Key("fencegw.upstream")
	// the code an enforcing upstream would have refused with (observe)
	attrWouldRefuse = attribute.Key("fencegw.would_refuse")
	attrStatus      = attribute.Key("http.response.status_code")
	attrMethod      = attribute.Key("http.request.method")
	attrPath        = attribute.Key("url.path")
)

// tracing is the gateway's tracer and the W3C trace-context propagator; a
// nil *tracing is off.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TraceContext
}

func newTracing(tp trace.TracerProvider) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{tracer: tp.Tracer(tracerName)}
}

// TraceLockWait returns the tokens.Config.OnLockWait hook that shows a
// fenced write's wait for its resource's shared lock as a "wait" span, a
// child of the admission span in ctx; nil for a nil tp.
func TraceLockWait(tp trace.TracerProvider) func(ctx context.Context) func() {
	if tp == nil {
		return nil
	}
	tracer := tp.Tracer(tracerName)
	return func(ctx context.Context) func() {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			return func() {} // not a traced request (a test's direct Admit)
		}
		_, span := tracer.Start(ctx, "wait", trace.WithSpanKind(trace.SpanKindInternal))
		return func() { span.End() }
	}
}

// traceServer is the outermost middleware when tracing is on: a server span
// for each request, continuing the client's traceparent.
func (g *Gateway) traceServer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := g.tr.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		name := r.Method
		if strings.HasPrefix(r.URL.Path, proxyPrefix) {
			name = "write"
		}
		ctx, span := g.tr.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attrMethod.String(r.Method), attrPath.String(truncateUTF8(r.URL.Path, 512))))
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			status := sw.status
			if status == 0 {
				status = http.StatusOK
			}
			span.SetAttributes(attrStatus.Int(status))
			if sw.code != "" {
				span.SetAttributes(attrCode.String(sw.code))
			}
			if status >= 500 {
				span.SetStatus(codes.Error, http.StatusText(status))
			}
			span.End()
		}()
		next.ServeHTTP(sw, r.WithContext(ctx))
	})
}

// statusWriter remembers the final status of an answer for the server span.
// Unwrap lets http.ResponseController reach the connection (deadlines,
// flushes, hijacks); Flush is for the stream's http.Flusher assertion.
type statusWriter struct {
	http.ResponseWriter
	status int
	code   string // the problem code, if the answer is a problem (sendProblem)
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// spanOf returns the recording span of ctx, or nil (tracing off, or not
// sampled), so that callers set attributes only when they are kept.
func spanOf(ctx context.Context) trace.Span {
	if s := trace.SpanFromContext(ctx); s.IsRecording() {
		return s
	}
	return nil
}

// nameSpan names the server span of ctx (acquire, renew, release) and sets
// the lease facts f has on it, if tracing is on. The facts are plain
// values, so a call costs nothing when tracing is off: attributes built at
// the call site would be allocated whether or not a span takes them.
func (c *control) nameSpan(ctx context.Context, name string, f spanFacts) {
	if !c.tracing {
		return
	}
	if s := spanOf(ctx); s != nil {
		s.SetName(name)
		switch {
		case f.hasResource && f.hasToken:
			s.SetAttributes(attrResource.String(f.resource), attrToken.Int64(f.token))
		case f.hasResource:
			s.SetAttributes(attrResource.String(f.resource))
		case f.hasToken:
			s.SetAttributes(attrToken.Int64(f.token))
		}
	}
}

// spanFacts are the facts of a lease a span may carry (never its id).
type spanFacts struct {
	resource              string
	token                 int64
	hasResource, hasToken bool
}

// leaseFacts: both facts of a lease.
func leaseFacts(resource string, token int64) spanFacts {
	return spanFacts{resource: resource, token: token, hasResource: true, hasToken: true}
}

// endSpan records the outcome of a control call on the server span: "ok" or
// the problem code of err.
func (c *control) endSpan(ctx context.Context, err error) {
	if !c.tracing {
		return
	}
	s := spanOf(ctx)
	if s == nil {
		return
	}
	if err == nil {
		s.SetAttributes(attrOutcome.String("ok"))
		return
	}
	s.SetAttributes(attrOutcome.String("refused")) // the code: sendProblem
}

// writeTrace is the tracing of one fenced write: the server span and the
// open child spans.
type writeTrace struct {
	server    trace.Span
	admission trace.Span
	forward   trace.Span
	// fwdCtx carries the forward span: the upstream's traceparent.
	fwdCtx context.Context
}

// beginWrite starts the admission span of a fenced write to upstream; nil
// if tracing is off. (An unsampled request still gets its spans, which
// record nothing, so that the upstream receives the gateway's context
// with the sampling decision.)
func (g *Gateway) beginWrite(ctx context.Context, upstream string) (*writeTrace, context.Context) {
	if g.tr == nil {
		return nil, ctx
	}
	server := trace.SpanFromContext(ctx)
	server.SetAttributes(attrUpstream.String(upstream))
	ctx, adm := g.tr.tracer.Start(ctx, "admission")
	return &writeTrace{server: server, admission: adm}, ctx
}

// admitted ends the admission span: err nil (admitted under resource and
// token, and on an observing upstream maybe with what would have refused
// it) or the refusal.
func (wt *writeTrace) admitted(resource string, token int64, err, wouldRefuse error) {
	if wt == nil {
		return
	}
	if e := tokens.ErrorOf(err); e != nil && resource == "" {
		resource, token = e.Resource, e.Token
	}
	attrs := []attribute.KeyValue{attrResource.String(resource), attrToken.Int64(token)} // never the lease id
	if err != nil {
		p, _ := problemFor(err)
		attrs = append(attrs, attrOutcome.String(outcomeRejected), attrCode.String(p.Code))
		wt.admission.SetAttributes(attrs...)
		wt.admission.End()
		wt.server.SetAttributes(attrs...)
		return
	}
	wt.admission.SetAttributes(append(attrs, attrOutcome.String("admitted"))...)
	if e := tokens.ErrorOf(wouldRefuse); e != nil {
		p, _ := problemFor(wouldRefuse)
		wt.admission.SetAttributes(attrWouldRefuse.String(p.Code))
		wt.server.SetAttributes(attrWouldRefuse.String(p.Code))
	}
	wt.admission.End()
	wt.server.SetAttributes(attrs...)
}

// beginForward starts the forward span, a client span whose context goes to
// the upstream (rewrite injects it).
func (wt *writeTrace) beginForward(ctx context.Context, tr *tracing, f *forward) {
	if wt == nil {
		return
	}
	wt.fwdCtx, wt.forward = tr.tracer.Start(ctx, "forward", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrUpstream.String(f.name), attrResource.String(f.permit.Lease.Resource), attrToken.Int64(f.permit.Lease.Token)))
	f.trace = wt
}

// endForward ends the forward span with the write's outcome.
func (wt *writeTrace) endForward(f *forward) {
	if wt == nil || wt.forward == nil {
		return
	}
	outcome := outcomeForwarded
	switch {
	case f.failed && f.badRequest:
		outcome = outcomeBadRequest
	case f.failed:
		outcome = outcomeUpstreamError
	}
	attrs := []attribute.KeyValue{attrOutcome.String(outcome), attribute.Bool("fencegw.outcome_unknown", f.unknown)}
	if f.status != 0 {
		attrs = append(attrs, attrStatus.Int(f.status))
	}
	wt.forward.SetAttributes(attrs...)
	if f.failed {
		wt.forward.SetStatus(codes.Error, outcome)
	}
	wt.forward.End()
	wt.server.SetAttributes(attrOutcome.String(outcome))
}

// inject replaces any traceparent and tracestate the client sent with
// the forward span's context, so that the upstream's trace continues from
// the gateway's hop. Without tracing the client's headers pass unchanged,
// as through any proxy that does not trace.
func (wt *writeTrace) inject(tr *tracing, h *wire.Fields) {
	if wt == nil || wt.fwdCtx == nil {
		return
	}
	h.Del("Traceparent")
	h.Del("Tracestate")
	tr.prop.Inject(wt.fwdCtx, wire.Carrier{Fields: h})
}

// traceID is the write's trace id, for its rejection.
func (wt *writeTrace) traceID() string {
	if sc := wt.server.SpanContext(); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}
