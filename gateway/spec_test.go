package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/fencegw/fencegw/api"
	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// TestServesSpec: the spec is served as YAML byte for byte, and as JSON
// that is the same document.
func TestServesSpec(t *testing.T) {
	_, _, base := newStreamGateway(t)

	resp, body := get(t, base+"/v1/openapi.yaml")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("GET /v1/openapi.yaml: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if !bytes.Equal(body, api.Spec) || !bytes.Contains(body, []byte("operationId: acquireLease")) {
		t.Fatalf("GET /v1/openapi.yaml is not api/openapi.yaml (%d bytes)", len(body))
	}

	resp, body = get(t, base+"/v1/openapi.json")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/openapi.json: %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var doc struct {
		OpenAPI string `json:"openapi"`
		Info    struct {
			Version string `json:"version"`
		} `json:"info"`
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas map[string]map[string]any `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("GET /v1/openapi.json is not JSON: %v", err)
	}
	if doc.OpenAPI != "3.0.3" || doc.Info.Version == "" {
		t.Errorf("openapi %q, info.version %q", doc.OpenAPI, doc.Info.Version)
	}
	// Every path of the YAML (counted from the text, not through the same
	// decoder) is in the JSON.
	yamlPaths := regexp.MustCompile(`(?m)^  (/[^:]*):$`).FindAllStringSubmatch(string(api.Spec), -1)
	if len(yamlPaths) == 0 || len(doc.Paths) != len(yamlPaths) {
		t.Errorf("the JSON has %d paths, the YAML %d", len(doc.Paths), len(yamlPaths))
	}
	for _, m := range yamlPaths {
		if _, ok := doc.Paths[m[1]]; !ok {
			t.Errorf("path %s is missing from the JSON", m[1])
		}
	}
	// YAML anchors are resolved, numbers stay numbers, times stay the
	// strings they were.
	var acquire struct {
		OperationID string `json:"operationId"`
		Responses   map[string]struct {
			Content map[string]struct {
				Example json.RawMessage `json:"example"`
			} `json:"content"`
		} `json:"responses"`
	}
	if err := json.Unmarshal(doc.Paths["/v1/leases"]["post"], &acquire); err != nil {
		t.Fatal(err)
	}
	if acquire.OperationID != "acquireLease" {
		t.Fatalf("POST /v1/leases: operationId %q", acquire.OperationID)
	}
	var lease map[string]any
	if err := json.Unmarshal(acquire.Responses["201"].Content["application/json"].Example, &lease); err != nil {
		t.Fatal(err)
	}
	if lease["token"] != float64(33) || lease["granted_at"] != "2026-11-30T00:41:37Z" {
		t.Errorf("the acquire example changed in conversion: %v", lease)
	}
	if codes, ok := doc.Components.Schemas["ProblemCode"]["x-extensible-enum"].([]any); !ok || len(codes) < 20 {
		t.Errorf("ProblemCode's known values are missing from the JSON: %v", doc.Components.Schemas["ProblemCode"])
	}
}

// TestIndex: GET /v1/ (and /v1) says where things are, and every place it
// names answers through the same router.
func TestIndex(t *testing.T) {
	for _, ui := range []bool{false, true} {
		store, err := bolt.Open(t.TempDir()+"/fencegw.db", bolt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		svc := tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: log})
		cfg := Config{Logger: log}
		if ui {
			cfg.UI = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "dashboard") })
		}
		g := New(svc, cfg)
		srv := httptest.NewServer(g)

		for _, path := range []string{"/v1/", "/v1"} {
			resp, body := get(t, srv.URL+path)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("GET %s: %d %q: %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			var idx map[string]string
			if err := json.Unmarshal(body, &idx); err != nil {
				t.Fatalf("GET %s: %v: %s", path, err, body)
			}
			for _, k := range []string{"api", "openapi_yaml", "openapi_json", "leases", "rejections", "proxy", "metrics", "healthz", "readyz"} {
				if idx[k] == "" {
					t.Errorf("GET %s: no %q in %s", path, k, body)
				}
			}
			if idx["service"] != "fencegw" || idx["api_version"] == "" {
				t.Errorf("GET %s: %s", path, body)
			}
			if _, has := idx["dashboard"]; has != ui {
				t.Errorf("GET %s with a dashboard %v: %s", path, ui, body)
			}
			for k, p := range idx {
				if !strings.HasPrefix(p, "/") || strings.Contains(p, "{") || k == "leases" || k == "rejections_stream" {
					continue // templated, POST-only, or a stream
				}
				if r, b := get(t, srv.URL+p); r.StatusCode != 200 {
					t.Errorf("GET %s (%s, from the index): %d %s", p, k, r.StatusCode, b)
				}
			}
		}
		g.Close()
		srv.Close()
		_ = store.Close()
	}
}
