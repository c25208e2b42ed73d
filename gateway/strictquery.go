package gateway

// Strict query parameters, as strict bodies (strictjson.go): the generated
// server binds the parameters an operation declares and ignores any other,
// so "?resorce=stmt:1" (a typo) lists every resource's rejections and
// looks like an answer about one. checkQuery refuses a parameter the call
// does not take, or one given twice, with 400 invalid_request naming it.
// The names are the spec's (api/openapi.yaml), read once per process.

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"
	"go.yaml.in/yaml/v3"

	"github.com/fencegw/fencegw/api"
	"github.com/fencegw/fencegw/tokens"
)

// specQuery is, for each operation of the spec ("GET /v1/rejections"),
// the names of its query parameters, the path's and the operation's,
// $refs followed.
var specQuery = sync.OnceValues(func() (map[string][]string, error) {
	type param struct {
		Ref  string `yaml:"$ref"`
		Name string `yaml:"name"`
		In   string `yaml:"in"`
	}
	var doc struct {
		Paths      map[string]map[string]yaml.Node `yaml:"paths"`
		Components struct {
			Parameters map[string]param `yaml:"parameters"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(api.Spec, &doc); err != nil {
		return nil, fmt.Errorf("api/openapi.yaml: %w", err)
	}
	names := func(ps []param) ([]string, error) {
		var out []string
		for _, p := range ps {
			if p.Ref != "" {
				ref, ok := doc.Components.Parameters[strings.TrimPrefix(p.Ref, "#/components/parameters/")]
				if !ok {
					return nil, fmt.Errorf("api/openapi.yaml: no parameter %s", p.Ref)
				}
				p = ref
			}
			if p.In == "query" {
				out = append(out, p.Name)
			}
		}
		return out, nil
	}
	ops := map[string][]string{}
	for path, item := range doc.Paths {
		var shared []param
		if n, ok := item["parameters"]; ok {
			if err := n.Decode(&shared); err != nil {
				return nil, fmt.Errorf("api/openapi.yaml: %s parameters: %w", path, err)
			}
		}
		for method, n := range item {
			if !slices.Contains(operations, method) {
				continue // parameters, summary, description, servers, $ref, x-…
			}
			var op struct {
				Parameters []param `yaml:"parameters"`
			}
			if err := n.Decode(&op); err != nil {
				return nil, fmt.Errorf("api/openapi.yaml: %s %s: %w", method, path, err)
			}
			q, err := names(append(shared[:len(shared):len(shared)], op.Parameters...))
			if err != nil {
				return nil, err
			}
			ops[strings.ToUpper(method)+" "+path] = q
		}
	}
	return ops, nil
})

// operations are the keys of an OpenAPI path item that name an operation.
var operations = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// checkQuery refuses r's query if it names a parameter the spec's operation
// "METHOD pattern" does not take (HEAD is GET's), or one twice; pattern ""
// is the route's (routePattern), looked up only for a request with a query.
// An operation the spec does not have is not checked.
func checkQuery(r *http.Request, pattern string) error {
	if r.URL.RawQuery == "" {
		return nil
	}
	if pattern == "" {
		pattern = routePattern(r)
	}
	method := r.Method
	if method == http.MethodHead {
		method = http.MethodGet
	}
	ops, err := specQuery()
	if err != nil {
		return nil // TestQueryParamsAreTheSpecs fails first
	}
	allowed, ok := ops[method+" "+pattern]
	if !ok {
		return nil
	}
	var seen []string
	for part := range strings.SplitSeq(r.URL.RawQuery, "&") {
		if part == "" {
			continue
		}
		raw, _, _ := strings.Cut(part, "=")
		name, err := url.QueryUnescape(raw)
		if err != nil {
			return tokens.Invalid("query", "is malformed: "+err.Error())
		}
		switch {
		case name == "":
			return tokens.Invalid("query", "has a parameter without a name")
		case !slices.Contains(allowed, name):
			detail := "is not a parameter of this call; it takes none"
			if len(allowed) > 0 {
				detail = "is not a parameter of this call (its parameters: " + strings.Join(allowed, ", ") + ")"
			}
			return tokens.Invalid(quoteField(name), detail)
		case slices.Contains(seen, name):
			return tokens.Invalid(name, "is given twice")
		}
		seen = append(seen, name)
	}
	return nil
}

// routePattern is the spec path of the operation serving r: the route's
// pattern when the router served it, else r's path (dispatch calls the
// acquire and the proxy past the router; neither path has a parameter).
func routePattern(r *http.Request) string {
	if rc := chi.RouteContext(r.Context()); rc != nil {
		if p := rc.RoutePattern(); p != "" {
			return p
		}
	}
	return r.URL.Path
}
