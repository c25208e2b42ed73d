package client_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// sdkModules are the only modules whose packages the SDK may link: a
// worker that imports client/ must not link the gateway's router, the
// stores' drivers or the dashboard's browser.
var sdkModules = []string{
	"github.com/fencegw/fencegw",      // client and api (types + generated client) only, see below
	"github.com/oapi-codegen/runtime", // the generated client's parameter binding
	"github.com/google/uuid",          // required by the runtime
	"github.com/apapsch/go-jsonmerge/v2",
}

// sdkPackages are the packages of this module the SDK may link.
var sdkPackages = []string{"github.com/fencegw/fencegw/client", "github.com/fencegw/fencegw/api"}

// TestSDKDependencies fails when the SDK's non-test build pulls in a module
// or a package of this module that it must not (chi, kin-openapi, pgx,
// go-redis, bbolt, prometheus, chromedp, the gateway, ...). It runs `go list
// -deps`, exactly what a worker's build would link.
func TestSDKDependencies(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the SDK's dependencies: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	var bad []string
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		pkg, mod, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch {
		case mod == "": // the standard library
		case !slices.Contains(sdkModules, mod):
			bad = append(bad, pkg+" (module "+mod+")")
		case mod == "github.com/fencegw/fencegw" && !slices.Contains(sdkPackages, pkg):
			bad = append(bad, pkg)
		}
	}
	if len(bad) > 0 {
		t.Errorf("the SDK links packages it must not (keep the server, stores and dashboard out of client/ and api/):\n  %s",
			strings.Join(bad, "\n  "))
	}
	for _, banned := range []string{"go-chi/chi", "getkin/kin-openapi", "jackc/pgx", "redis/go-redis", "go.etcd.io/bbolt", "prometheus", "chromedp"} {
		if strings.Contains(string(out), banned) {
			t.Errorf("the SDK links %s", banned)
		}
	}
}
