package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// What tracing costs a fenced write, one write at a time through a real
// listener and upstream: off (no TracerProvider, the default: the write
// path runs only nil checks), on but not sampled, and on and sampled into
// an in-memory exporter. docs/benchmarks.md has the figures:
//
//	go test -run '^$' -bench FencedWriteTracing -benchmem -count 6 ./gateway/
func BenchmarkFencedWriteTracing(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	b.Cleanup(up.Close)
	body := bytes.Repeat([]byte("x"), 256)
	for _, c := range []struct {
		name    string
		sampler sdktrace.Sampler // nil: no TracerProvider
	}{{"off", nil}, {"on-unsampled", sdktrace.NeverSample()}, {"on-sampled", sdktrace.AlwaysSample()}} {
		b.Run(c.name, func(b *testing.B) {
			var cfg Config
			if c.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(c.sampler),
					sdktrace.WithSyncer(tracetest.NewNoopExporter()))
				b.Cleanup(func() { _ = tp.Shutdown(b.Context()) })
				cfg.TracerProvider = tp
			}
			tg := startFraming(b, up.URL, cfg, false)
			lease := tg.lease(b, "bench")
			client := &http.Client{Timeout: 10 * time.Second}
			url := "http://" + tg.addr + "/v1/proxy/svc/lines"
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set(HeaderLease, lease)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("write: %d", resp.StatusCode)
				}
			}
		})
	}
}
