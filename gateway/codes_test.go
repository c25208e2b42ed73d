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

// TestProblemCodesMatchSpec fails when the codes the gateway answers (its
// code* constants and the tokens package's Code* ones) and the spec's
// ProblemCode disagree, either way.
func TestProblemCodesMatchSpec(t *testing.T) {
	known := specKnownValues(t, "ProblemCode")
	served := map[string]string{}
	for name, v := range stringConsts(t, ".", "code") {
		served[v] = "gateway." + name
	}
	for name, v := range stringConsts(t, "../tokens", "Code") {
		served[v] = "tokens." + name
	}
	for v, name := range served {
		if !slices.Contains(known, v) {
			t.Errorf("%s = %q is answered by the gateway but not a known value of the spec's ProblemCode", name, v)
		}
	}
	for _, v := range known {
		if _, ok := served[v]; !ok {
			t.Errorf("the spec's ProblemCode lists %q, which no gateway or tokens constant answers", v)
		}
	}
	// The table that maps domain errors to answers uses known codes too.
	for _, k := range kinds {
		if !slices.Contains(known, k.code) {
			t.Errorf("problemFor answers %q, not in the spec", k.code)
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
