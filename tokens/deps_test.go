package tokens_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDomainDependencies keeps the domain free of drivers, HTTP and the
// other layers (docs/design.md, Layout): the tokens package links the
// standard library and, of this module, only internal/failpoint, a package
// of constants with no imports of its own that the normal build folds away.
func TestDomainDependencies(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the domain's dependencies: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	allowed := map[string]bool{
		"github.com/fencegw/fencegw/tokens":             true,
		"github.com/fencegw/fencegw/internal/failpoint": true,
	}
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		pkg, mod, _ := strings.Cut(strings.TrimSpace(line), " ")
		if mod != "" && !allowed[pkg] {
			t.Errorf("tokens links %s (module %s): the domain takes the standard library only", pkg, mod)
		}
	}
}
