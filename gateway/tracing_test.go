package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fencegw/fencegw/tokens"
)

func tokensAcquire(resource string) tokens.AcquireRequest {
	return tokens.AcquireRequest{Resource: resource, Holder: "other", TTL: time.Minute, Wait: 10 * time.Second}
}

const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	clientParent  = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// With tracing, the upstream receives the gateway's forward span as its
// traceparent's parent, in the client's trace, never the client's own
// header; without tracing the client's header passes unchanged, as through
// a plain proxy.
func TestTraceparentToUpstream(t *testing.T) {
	for _, traced := range []bool{true, false} {
		name := map[bool]string{true: "traced", false: "untraced"}[traced]
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

// An upstream that only observes forwards a write under a superseded lease
// and records what an enforcing one would have refused: in the API (with
// would_refuse and the write's trace id) and in the metrics. An unknown
// lease is still refused.
func TestObserveRecordsWouldRefuse(t *testing.T) {
	var mu sync.Mutex
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get(HeaderToken))
		mu.Unlock()
	}))
	t.Cleanup(up.Close)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	tg := startFraming(t, up.URL, Config{Observe: map[string]bool{"svc": true}, TracerProvider: tp}, false)
	old := tg.leaseTTL(t, "obs", 100*time.Millisecond)
	// The old lease runs out and another worker takes the resource: the
	// old one is now stale.
	if _, err := tg.svc.Acquire(t.Context(), tokensAcquire("obs")); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	write := func(lease string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+tg.addr+"/v1/proxy/svc/x", strings.NewReader("body"))
		req.Header.Set(HeaderLease, lease)
		req.Header.Set("Traceparent", clientParent)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := write(old); code != http.StatusOK {
		t.Fatalf("stale write to an observing upstream: %d, want it forwarded", code)
	}
	if code := write("fl_unknown"); code != http.StatusForbidden {
		t.Fatalf("unknown lease on an observing upstream: %d, want 403", code)
	}
	mu.Lock()
	if len(got) != 1 || got[0] != "1" {
		t.Fatalf("upstream got tokens %q, want the stale write's 1 only", got)
	}
	mu.Unlock()

	resp, err := client.Get("http://" + tg.addr + "/v1/rejections?resource=obs")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(list.Items) != 1 {
		t.Fatalf("rejections of obs: %v, want one", list.Items)
	}
	r := list.Items[0]
	if r["would_refuse"] != true || r["code"] != "stale_token" || r["trace_id"] != clientTraceID {
		t.Fatalf("rejection %v, want would_refuse, stale_token, trace id %s", r, clientTraceID)
	}
	resp, err = client.Get("http://" + tg.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `fencegw_would_refuse_total{reason="stale_token",upstream="svc"} 1`; !strings.Contains(string(body), want) {
		t.Fatalf("metrics lack %s", want)
	}
	if strings.Contains(string(body), `fencegw_rejections_total{reason="stale_token"} 1`) {
		t.Fatal("an observed write counted as refused")
	}
}

// With tracing, a refused write's rejection carries its trace id, so that
// the incident links to its trace; without, it has none.
func TestRejectionCarriesTraceID(t *testing.T) {
	for _, traced := range []bool{true, false} {
		up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		t.Cleanup(up.Close)
		var cfg Config
		if traced {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
			t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
			cfg.TracerProvider = tp
		}
		tg := startFraming(t, up.URL, cfg, false)
		old := tg.lease(t, "rej")
		if _, err := tg.svc.Release(t.Context(), old, ""); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, "http://"+tg.addr+"/v1/proxy/svc/x", strings.NewReader("body"))
		req.Header.Set(HeaderLease, old)
		req.Header.Set("Traceparent", clientParent)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict {
			t.Fatalf("write under a released lease: %d", resp.StatusCode)
		}
		rejs, err := tg.svc.Rejections(t.Context(), tokens.RejectionQuery{Resource: "rej", Limit: 10})
		if err != nil || len(rejs) != 1 {
			t.Fatalf("rejections %v %v", rejs, err)
		}
		want := ""
		if traced {
			want = clientTraceID
		}
		if rejs[0].TraceID != want || rejs[0].WouldRefuse {
			t.Fatalf("traced %v: rejection trace id %q would_refuse %v, want %q and false", traced, rejs[0].TraceID, rejs[0].WouldRefuse, want)
		}
	}
}
