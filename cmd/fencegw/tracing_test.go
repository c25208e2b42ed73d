package main

import (
	"bytes"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes each
// ExportTraceServiceRequest posted to /v1/traces, as a collector would.
type otlpReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
			http.Error(w, "want protobuf at /v1/traces", http.StatusBadRequest)
			return
		}
		var req coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					rc.services = append(rc.services, a.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func attr(s *tracepb.Span, key string) (string, bool) {
	for _, a := range s.Attributes {
		if a.Key == key {
			switch v := a.GetValue().Value.(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue, true
			case *commonpb.AnyValue_IntValue:
				return strconv.FormatInt(v.IntValue, 10), true
			}
			return a.GetValue().String(), true
		}
	}
	return "", false
}

// One fenced write, traced end to end: the worker's traceparent is
// continued by the gateway's server span, whose children are admission
// (with the lock wait inside it) and forward; the upstream receives the
// forward span as its parent; spans carry the resource and token and
// never the lease id; the spans reach a real OTLP/HTTP receiver, flushed at
// shutdown.
func TestTraceOfAFencedWrite(t *testing.T) {
	rc := newOTLPReceiver(t)
	var mu sync.Mutex
	var upstreamParent []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstreamParent = append(upstreamParent, r.Header.Values("Traceparent")...)
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	p := startProcEnv(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rc.URL, "OTEL_SERVICE_NAME=fencegw-test"},
		"--data", t.TempDir(), "--upstream", "svc="+up.URL)
	l := acquire(t, p.url(), "traced", "A", time.Minute, 0)

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	code, body := post(t, p.url()+"/v1/proxy/svc/x", "write", "Fencing-Lease", l.LeaseID, "Traceparent", "00-"+traceID+"-"+parentID+"-01")
	if code != http.StatusOK {
		t.Fatalf("write: %d %s", code, body)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("did not exit after SIGTERM")
	}

	rc.mu.Lock()
	defer rc.mu.Unlock()
	byName := map[string]*tracepb.Span{}
	for _, s := range rc.spans {
		if hex.EncodeToString(s.TraceId) == traceID {
			byName[s.Name] = s
		}
		for _, a := range s.Attributes {
			if strings.Contains(a.GetValue().String(), l.LeaseID) {
				t.Errorf("span %s carries the lease id in %s", s.Name, a.Key)
			}
		}
		if s.Name == "acquire" {
			byName["acquire"] = s
		}
	}
	if len(rc.services) == 0 || rc.services[0] != "fencegw-test" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", rc.services)
	}
	server, admission, wait, forward := byName["write"], byName["admission"], byName["wait"], byName["forward"]
	if server == nil || admission == nil || wait == nil || forward == nil || byName["acquire"] == nil {
		t.Fatalf("spans of the worker's trace: %v; want acquire (own trace), write, admission, wait, forward", keys(byName))
	}
	parentOf := func(child, parent *tracepb.Span) {
		t.Helper()
		if !bytes.Equal(child.ParentSpanId, parent.SpanId) {
			t.Errorf("%s's parent is %x, want %s (%x)", child.Name, child.ParentSpanId, parent.Name, parent.SpanId)
		}
	}
	if hex.EncodeToString(server.ParentSpanId) != parentID || server.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("server span: parent %x kind %v, want the worker's %s, server", server.ParentSpanId, server.Kind, parentID)
	}
	parentOf(admission, server)
	parentOf(wait, admission)
	parentOf(forward, server)
	if forward.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("forward span kind %v, want client", forward.Kind)
	}
	for _, s := range []*tracepb.Span{server, admission, forward} {
		if v, _ := attr(s, "fencegw.resource"); v != "traced" {
			t.Errorf("%s: fencegw.resource %q", s.Name, v)
		}
		if _, ok := attr(s, "fencegw.token"); !ok {
			t.Errorf("%s: no fencegw.token", s.Name)
		}
	}
	if v, _ := attr(server, "fencegw.outcome"); v != "forwarded" {
		t.Errorf("server span outcome %q, want forwarded", v)
	}
	mu.Lock()
	defer mu.Unlock()
	want := "00-" + traceID + "-" + hex.EncodeToString(forward.SpanId) + "-01"
	if len(upstreamParent) != 1 || upstreamParent[0] != want {
		t.Errorf("upstream got traceparent %q, want %q (the forward span)", upstreamParent, want)
	}
}

func keys(m map[string]*tracepb.Span) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Tracing is off unless the standard variables ask for it, and an exporter
// or protocol that is not built in is refused rather than ignored.
func TestTracingSetting(t *testing.T) {
	for _, c := range []struct {
		env     map[string]string
		on, bad bool
	}{
		{env: nil},
		{env: map[string]string{"OTEL_SERVICE_NAME": "x"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, on: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, on: true},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, bad: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, bad: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, on: true},
	} {
		on, err := tracingSetting(func(k string) string { return c.env[k] })
		if on != c.on || (err != nil) != c.bad {
			t.Errorf("%v: on %v err %v, want on %v bad %v", c.env, on, err, c.on, c.bad)
		}
	}
}
