package gateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fencegw/fencegw/api"
	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// specKnownValues returns the x-extensible-enum of a schema of the spec:
// the one list of problem and rejection codes that the gateway,
// the tokens package and the SDK (client/codes_test.go) are checked
// against.
func specKnownValues(t *testing.T, schema string) []string {
	t.Helper()
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Type  string   `yaml:"type"`
				Enum  []string `yaml:"enum"`
				Known []string `yaml:"x-extensible-enum"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(api.Spec, &doc); err != nil {
		t.Fatal(err)
	}
	s, ok := doc.Components.Schemas[schema]
	if !ok || s.Type != "string" || len(s.Enum) > 0 || len(s.Known) == 0 {
		t.Fatalf("the spec's %s must be an open string with x-extensible-enum (no closed enum): %+v", schema, s)
	}
	return s.Known
}

// stringConsts returns the values of the string constants in the non-test
// Go files of dir whose names start with prefix.
func stringConsts(t *testing.T, dir, prefix string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, prefix) || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						out[name.Name] = v
					}
				}
			}
		}
	}
	return out
}

// TestProblemCodesMatchSpec fails when the one table of problems
// (internal/problems) and the spec's ProblemCode disagree, either way, or
// when a code constant (the tokens package's Code* ones, the kinds'
// codes, and internal/problems' own) has no row in the table, so that a
// refusal would be answered 500.
func TestProblemCodesMatchSpec(t *testing.T) {
	known := specKnownValues(t, "ProblemCode")
	table := map[string]bool{}
	for _, p := range problems.All() {
		table[p.Code] = true
		if !slices.Contains(known, p.Code) {
			t.Errorf("the table of problems answers %q, not a known value of the spec's ProblemCode", p.Code)
		}
	}
	for _, v := range known {
		if !table[v] {
			t.Errorf("the spec's ProblemCode lists %q, which the table of problems does not answer", v)
		}
	}
	for pkg, dir := range map[string]string{"tokens": "../tokens", "problems": "../internal/problems"} {
		for name, v := range stringConsts(t, dir, "Code") {
			if !table[v] {
				t.Errorf("%s.%s = %q has no row in the table of problems", pkg, name, v)
			}
		}
	}
}

// TestRejectionCodesMatchSpec: the codes a rejection can have (tokens) are
// the spec's RejectionCode, and each is also a ProblemCode.
func TestRejectionCodesMatchSpec(t *testing.T) {
	known := specKnownValues(t, "RejectionCode")
	problems := specKnownValues(t, "ProblemCode")
	a, b := slices.Clone(known), slices.Clone(tokens.RejectionCodes)
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		t.Errorf("spec RejectionCode %v, tokens.RejectionCodes %v", a, b)
	}
	for _, c := range known {
		if !slices.Contains(problems, c) {
			t.Errorf("rejection code %q is not a ProblemCode", c)
		}
	}
}
