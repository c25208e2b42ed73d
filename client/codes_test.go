package client

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fencegw/fencegw/api"
)

// TestCodesMatchSpec fails when the SDK's Code* constants and the known
// values of the spec's ProblemCode (the one list; the gateway's own test,
// gateway/codes_test.go, holds the server to it) disagree, either way.
// yaml.v3 is a test-only import: the SDK itself does not link it.
func TestCodesMatchSpec(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Known []string `yaml:"x-extensible-enum"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(api.Spec, &doc); err != nil {
		t.Fatal(err)
	}
	known := doc.Components.Schemas["ProblemCode"].Known
	if len(known) == 0 {
		t.Fatal("the spec's ProblemCode has no x-extensible-enum")
	}

	file, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	sdk := map[string]string{} // value -> constant name
	for _, d := range file.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Code") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					if prev, dup := sdk[v]; dup {
						t.Errorf("%s and %s are both %q", prev, name.Name, v)
					}
					sdk[v] = name.Name
				}
			}
		}
	}
	for v, name := range sdk {
		if !slices.Contains(known, v) {
			t.Errorf("client.%s = %q is not a known value of the spec's ProblemCode", name, v)
		}
	}
	for _, v := range known {
		if _, ok := sdk[v]; !ok {
			t.Errorf("the spec's ProblemCode %q has no client.Code* constant", v)
		}
	}
}
