package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	clientParent  = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// With tracing, the upstream receives the gateway's forward span as its
// traceparent's parent, in the client's trace, on both forwarding paths
// (the engine's direct forward and the reverse proxy), never the client's
// own header; without tracing the client's header passes unchanged, as
// through a plain proxy.
func TestTraceparentToUpstream(t *testing.T) {
	for _, traced := range []bool{true, false} {
		for _, direct := range []bool{true, false} {
			name := map[bool]string{true: "traced", false: "untraced"}[traced] + "/" + map[bool]string{true: "direct", false: "reverse-proxy"}[direct]
			t.Run(name, func(t *testing.T) {
				var mu sync.Mutex
				var got []string
				up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					got = append(got, r.Header.Values("Traceparent")...)
					mu.Unlock()
				}))
				t.Cleanup(up.Close)
				var cfg Config
				exp := tracetest.NewInMemoryExporter()
				if traced {
					tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
					t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
					cfg.TracerProvider = tp
				}
				tg := startFraming(t, up.URL, cfg, false)
				tg.g.direct = direct
				lease := tg.lease(t, "r")
				req, _ := http.NewRequest(http.MethodPost, "http://"+tg.addr+"/v1/proxy/svc/x", strings.NewReader("body"))
				req.Header.Set(HeaderLease, lease)
				req.Header.Set("Traceparent", clientParent)
				req.Header.Set("Tracestate", "vendor=client")
				resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("write: %d", resp.StatusCode)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(got) != 1 {
					t.Fatalf("upstream got traceparent %q, want one", got)
				}
				if !traced {
					if got[0] != clientParent {
						t.Fatalf("untraced: upstream got %q, want the client's %q", got[0], clientParent)
					}
					return
				}
				spans := exp.GetSpans()
				var forward *tracetest.SpanStub
				for i := range spans {
					if spans[i].Name == "forward" {
						forward = &spans[i]
					}
				}
				if forward == nil {
					t.Fatalf("no forward span among %d", len(spans))
				}
				want := "00-" + clientTraceID + "-" + forward.SpanContext.SpanID().String() + "-01"
				if got[0] != want {
					t.Fatalf("upstream got traceparent %q, want %q (the forward span)", got[0], want)
				}
			})
		}
	}
}
