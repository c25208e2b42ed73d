package replica_test

import (
	"os/exec"
	"strings"
	"testing"
)

// backends are the storage packages only storage/mode may wire.
var backends = []string{
	"github.com/fencegw/fencegw/storage/bolt",
	"github.com/fencegw/fencegw/storage/postgres",
	"github.com/fencegw/fencegw/storage/redis",
}

// The product packages import no backend package in their non-test
// files: gateway, web, auth, tokens and client not even indirectly; the
// wiring (cmd/fencegw and this package) only through storage/mode.
func TestProductPackagesImportNoBackend(t *testing.T) {
	list := func(format string, pkgs ...string) map[string][]string {
		t.Helper()
		// Without -test, go list reads the non-test files only.
		out, err := exec.CommandContext(t.Context(), "go", append([]string{"list", "-f", format}, pkgs...)...).Output()
		if err != nil {
			t.Fatalf("go list: %v", err)
		}
		got := map[string][]string{}
		for line := range strings.Lines(string(out)) {
			f := strings.Fields(line)
			if len(f) > 0 {
				got[f[0]] = f[1:]
			}
		}
		if len(got) == 0 {
			t.Fatal("go list listed no package")
		}
		return got
	}
	check := func(what string, imports map[string][]string) {
		t.Helper()
		for pkg, imps := range imports {
			for _, imp := range imps {
				for _, b := range backends {
					if imp == b || strings.HasPrefix(imp, b+"/") {
						t.Errorf("%s imports %s (%s)", pkg, imp, what)
					}
				}
			}
		}
	}
	check("directly", list(`{{.ImportPath}} {{join .Imports " "}}`, "../cmd/fencegw", "."))
	check("through its dependencies", list(`{{.ImportPath}} {{join .Deps " "}}`,
		"../gateway/...", "../web/...", "../auth/...", "../tokens/...", "../client/..."))
}
