package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reload checks a new live configuration as a whole: one whose routes,
// observed upstreams or credentials name an upstream it lacks is refused
// and changes nothing; a good one is applied and counted.
func TestReloadRefusesAnInconsistentConfiguration(t *testing.T) {
	reg := prometheus.NewRegistry()
	up, _ := url.Parse("http://127.0.0.1:1")
	g := New(nil, Config{Registry: reg, Upstreams: map[string]*url.URL{"a": up}})
	defer g.Close()
	before := g.live.Load()
	for name, l := range map[string]Live{
		"route":       {Upstreams: map[string]*url.URL{"a": up}, Routes: []*Route{mustRoute(t, "b/**=r*")}},
		"observe":     {Upstreams: map[string]*url.URL{"a": up}, Observe: map[string]bool{"b": true}},
		"credentials": {Upstreams: map[string]*url.URL{"a": up}, UpstreamHeaders: map[string]http.Header{"b": {}}},
	} {
		if err := g.Reload(l); err == nil || !strings.Contains(err.Error(), `"b"`) {
			t.Errorf("%s: Reload = %v, want a refusal naming upstream b", name, err)
		}
	}
	if g.live.Load() != before || g.Generation() != 0 {
		t.Fatal("a refused reload changed the configuration")
	}
	if err := g.Reload(Live{Upstreams: map[string]*url.URL{"b": up}, Routes: []*Route{mustRoute(t, "b/**=r*")}}); err != nil {
		t.Fatal(err)
	}
	if g.Generation() != 1 || g.live.Load().upstreams["b"] == nil || g.live.Load().bindings["b"] == nil {
		t.Fatal("a good reload was not applied")
	}
	got := map[string]float64{}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "fencegw_config_reloads_total" {
			for _, m := range f.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if got["ok"] != 1 || got["error"] != 3 {
		t.Fatalf("fencegw_config_reloads_total: %v, want ok 1 and error 3", got)
	}
}

// A request's scope is its context: it ends when the request's does, and a
// context made from it (context.AfterFunc, WithCancel) follows it.
func TestScopeEndsWithItsRequest(t *testing.T) {
	g := &Gateway{}
	g.live.Store(&live{})
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), http.ServerContextKey, nil))
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", nil)
	var b requestBase
	r = g.scopeInto(r, &b.scope, &b.req)
	child, stop := context.WithCancel(r.Context())
	defer stop()
	called := make(chan struct{})
	context.AfterFunc(r.Context(), func() { close(called) })
	cancel()
	for name, done := range map[string]<-chan struct{}{"the scope": r.Context().Done(), "a child": child.Done(), "AfterFunc": called} {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not end with the request", name)
		}
	}
	if r.Context().Err() != context.Canceled {
		t.Fatalf("Err = %v, want context.Canceled", r.Context().Err())
	}
}
