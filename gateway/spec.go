package gateway

// The OpenAPI document served at /v1/openapi.yaml and /v1/openapi.json,
// and the API index: api/openapi.yaml, embedded, converted once per
// process.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"go.yaml.in/yaml/v3"

	"github.com/fencegw/fencegw/api"
)

// Where the spec and the index are served (docs/design.md, "HTTP surface").
const (
	pathIndex    = "/v1/"
	pathSpecYAML = "/v1/openapi.yaml"
	pathSpecJSON = "/v1/openapi.json"
)

// spec is api/openapi.yaml converted to JSON, and its info.version, once
// per process (the YAML is embedded, so this cannot fail in a built
// binary that passed its tests; TestServesSpec checks it).
var spec = sync.OnceValues(func() (specDoc, error) {
	var doc any
	if err := yaml.Unmarshal(api.Spec, &doc); err != nil {
		return specDoc{}, fmt.Errorf("api/openapi.yaml: %w", err)
	}
	doc, err := jsonValue(doc)
	if err != nil {
		return specDoc{}, fmt.Errorf("api/openapi.yaml: %w", err)
	}
	out := specDoc{}
	if out.json, err = json.Marshal(doc); err != nil {
		return specDoc{}, fmt.Errorf("api/openapi.yaml to JSON: %w", err)
	}
	if m, ok := doc.(map[string]any); ok {
		if info, ok := m["info"].(map[string]any); ok {
			out.version, _ = info["version"].(string)
		}
	}
	return out, nil
})

type specDoc struct {
	json    []byte
	version string
}

// jsonValue turns a decoded YAML value into one encoding/json renders as
// the same document: mappings with non-string keys (yaml.v3 decodes a
// mapping with an unquoted 200 as a key to map[any]any) get string keys.
func jsonValue(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			v[k] = c
		}
		return v, nil
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			switch k.(type) {
			case string, int, int64, uint64, bool, float64:
			default:
				return nil, fmt.Errorf("a mapping key of type %T has no JSON form", k)
			}
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			m[fmt.Sprint(k)] = c
		}
		return m, nil
	case []any:
		for i, e := range v {
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			v[i] = c
		}
		return v, nil
	}
	return v, nil
}

func (g *Gateway) serveSpecYAML(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/yaml") // RFC 9512
	h.Set("Cache-Control", "no-cache")
	_, _ = w.Write(api.Spec)
}

func (g *Gateway) serveSpecJSON(w http.ResponseWriter, r *http.Request) {
	doc, err := spec()
	if err != nil {
		writeProblem(w, r, g.log, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	_, _ = w.Write(doc.json)
}

// index is the answer of GET /v1/ (the spec's Index schema).
type index struct {
	Service          string `json:"service"`
	APIVersion       string `json:"api_version"`
	API              string `json:"api"`
	OpenAPIYAML      string `json:"openapi_yaml"`
	OpenAPIJSON      string `json:"openapi_json"`
	Leases           string `json:"leases"`
	Resources        string `json:"resources"`
	Rejections       string `json:"rejections"`
	RejectionsStream string `json:"rejections_stream"`
	Proxy            string `json:"proxy"`
	Dashboard        string `json:"dashboard,omitempty"`
	Metrics          string `json:"metrics"`
	Healthz          string `json:"healthz"`
	Readyz           string `json:"readyz"`
}

func (g *Gateway) serveIndex(w http.ResponseWriter, r *http.Request) {
	doc, err := spec()
	if err != nil {
		writeProblem(w, r, g.log, err)
		return
	}
	out := index{
		Service:          "fencegw",
		APIVersion:       doc.version,
		API:              pathIndex,
		OpenAPIYAML:      pathSpecYAML,
		OpenAPIJSON:      pathSpecJSON,
		Leases:           "/v1/leases",
		Resources:        "/v1/resources/{resource}",
		Rejections:       "/v1/rejections",
		RejectionsStream: "/v1/rejections/stream",
		Proxy:            proxyPrefix + "{upstream}/{path}",
		Metrics:          "/metrics",
		Healthz:          "/healthz",
		Readyz:           "/readyz",
	}
	if g.cfg.UI != nil {
		out.Dashboard = "/ui/"
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(out)
}
