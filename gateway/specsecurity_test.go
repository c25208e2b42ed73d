package gateway

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fencegw/fencegw/api"
)

// specOperation is one operation of api/openapi.yaml with its declared
// security requirements (each a map of scheme name to scopes).
type specOperation struct {
	method, path, id string
	security         []map[string][]string
	hasDefault       bool
}

func specOperations(t *testing.T) []specOperation {
	t.Helper()
	var doc struct {
		Security *[]map[string][]string `yaml:"security"`
		Paths    map[string]map[string]yaml.Node
	}
	if err := yaml.Unmarshal(api.Spec, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Security != nil {
		t.Errorf("the spec has a global security requirement %v: declare it per operation, so no generator offers a scheme where the gateway refuses it", *doc.Security)
	}
	var ops []specOperation
	for path, item := range doc.Paths {
		for method, node := range item {
			switch method {
			case "get", "put", "post", "delete", "patch", "head", "options":
			default:
				continue
			}
			var op struct {
				OperationID string                 `yaml:"operationId"`
				Security    *[]map[string][]string `yaml:"security"`
				Responses   map[string]yaml.Node   `yaml:"responses"`
			}
			if err := node.Decode(&op); err != nil {
				t.Fatal(err)
			}
			if op.Security == nil {
				t.Errorf("%s declares no security", op.OperationID)
				continue
			}
			_, hasDefault := op.Responses["default"]
			ops = append(ops, specOperation{strings.ToUpper(method), path, op.OperationID, *op.Security, hasDefault})
		}
	}
	if len(ops) < 10 {
		t.Fatalf("only %d operations in the spec", len(ops))
	}
	return ops
}

// TestSpecSecurityMatchesGateway: each operation's declared security is
// what the gateway enforces with --auth-file. An operation with no
// requirement answers without a key; every other takes a bearer key, and
// HTTP Basic exactly where it lists dashboardKey (elsewhere Basic is 401);
// each keyed one also lists {} (no key when authentication is off).
func TestSpecSecurityMatchesGateway(t *testing.T) {
	up := newRecorder(t)
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "dashboard") })
	tg := startFraming(t, up.URL, Config{UI: ui, Auth: keyring{"k-admin": {Name: "admin", Role: RoleAdmin}}}, false)
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("any:k-admin"))
	status := func(t *testing.T, op specOperation, authorization string) int {
		t.Helper()
		path := strings.NewReplacer("{lease_id}", "fl_nosuchlease", "{resource}", "r").Replace(op.path)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel() // the live stream answers its headers, then streams
		var body io.Reader
		if op.method == http.MethodPost {
			body = strings.NewReader("{}")
		}
		req, err := http.NewRequestWithContext(ctx, op.method, "http://"+tg.addr+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for _, op := range specOperations(t) {
		t.Run(op.id, func(t *testing.T) {
			schemes := map[string]bool{}
			for _, req := range op.security {
				if len(req) > 1 {
					t.Errorf("requirement %v needs several schemes at once; the gateway takes one", req)
				}
				for name := range req {
					schemes[name] = true
				}
				if len(req) == 0 {
					schemes[""] = true
				}
			}
			if !op.hasDefault {
				t.Errorf("no default response (application/problem+json) beside the documented ones")
			}
			noKey := status(t, op, "")
			if len(op.security) == 0 {
				if noKey == http.StatusUnauthorized {
					t.Errorf("declares no security, but answers 401 without a key")
				}
				return
			}
			if noKey != http.StatusUnauthorized {
				t.Errorf("declares %v, but answers %d without a key", op.security, noKey)
			}
			if !schemes["apiKey"] || !schemes[""] {
				t.Errorf("security %v: want apiKey and {} (no key without --auth-file)", op.security)
			}
			if got := status(t, op, "Bearer k-admin"); got == http.StatusUnauthorized {
				t.Errorf("declares apiKey, but a bearer key gets 401")
			}
			got := status(t, op, basic)
			if schemes["dashboardKey"] && got == http.StatusUnauthorized {
				t.Errorf("declares dashboardKey, but HTTP Basic gets 401")
			}
			if !schemes["dashboardKey"] && got != http.StatusUnauthorized {
				t.Errorf("does not declare dashboardKey, but HTTP Basic gets %d", got)
			}
			for name := range schemes {
				if !slices.Contains([]string{"", "apiKey", "dashboardKey"}, name) {
					t.Errorf("unknown scheme %q", name)
				}
			}
		})
	}
}
