package failpoint

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// In the normal build no failpoint is on; built with one tag (go test
// -tags fencegw_break_no_owner ./internal/failpoint) exactly that one is.
func TestOnlyTheActiveBreakIsOn(t *testing.T) {
	if a := Active(); a != "" && !slices.ContainsFunc(Breaks, func(b Break) bool { return b.Name == a }) {
		t.Fatalf("active failpoint %q is not in Breaks", a)
	}
	for _, b := range Breaks {
		if b.On != (b.Name == Active()) {
			t.Errorf("%s: On = %v in a build with failpoint %q", b.Name, b.On, Active())
		}
	}
}

func TestBreaksAreWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range Breaks {
		if seen[b.Name] {
			t.Errorf("%s listed twice", b.Name)
		}
		seen[b.Name] = true
		if b.Mode == "" || len(b.CaughtBy) == 0 {
			t.Errorf("%s: needs a torture mode and the rules that catch it: %+v", b.Name, b)
		}
		if strings.ContainsAny(b.Name+b.Mode+b.Faults, " \t\n") {
			t.Errorf("%s: the script reads name, mode and faults as words: %+v", b.Name, b)
		}
	}
}

// The build-tag files must agree with Breaks: one file per break that sets
// active to its name under its own tag, and off.go for none of them. A
// break listed without its file, or a file without its entry, would leave
// a broken build that CI never builds.
func TestTagFilesMatchBreaks(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var tagged []string
	for _, f := range files {
		expr := buildConstraint(t, f)
		if expr == nil || strings.HasSuffix(f, "_test.go") {
			continue
		}
		if f == "off.go" {
			var tags []string
			for _, b := range Breaks {
				tags = append(tags, b.Tag())
			}
			// off.go must be on exactly when no listed tag is set.
			for _, tag := range append(tags, "") {
				want := tag == ""
				if got := expr.Eval(func(s string) bool { return s == tag }); got != want {
					t.Errorf("off.go: constraint %s is %v with tag %q, want %v", expr, got, tag, want)
				}
			}
			continue
		}
		name := strings.TrimSuffix(f, ".go")
		tag, ok := expr.(*constraint.TagExpr)
		if !ok || tag.Tag != "fencegw_break_"+name {
			t.Errorf("%s: constraint %s, want //go:build fencegw_break_%s", f, expr, name)
			continue
		}
		if got := activeValue(t, f); got != name {
			t.Errorf("%s sets active to %q, want %q", f, got, name)
		}
		tagged = append(tagged, name)
	}
	var listed []string
	for _, b := range Breaks {
		listed = append(listed, b.Name)
	}
	slices.Sort(tagged)
	slices.Sort(listed)
	if !slices.Equal(tagged, listed) {
		t.Errorf("tag files %v, Breaks %v", tagged, listed)
	}
}

func buildConstraint(t *testing.T, file string) constraint.Expr {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(src)) {
		if constraint.IsGoBuild(line) {
			expr, err := constraint.Parse(line)
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			return expr
		}
		if strings.HasPrefix(line, "package ") {
			break
		}
	}
	return nil
}

// activeValue returns the string constant a tag file gives active.
func activeValue(t *testing.T, file string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			if len(v.Names) != 1 || v.Names[0].Name != "active" || len(v.Values) != 1 {
				continue
			}
			if lit, ok := v.Values[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
		}
	}
	t.Fatalf("%s: no const active = \"...\"", file)
	return ""
}

// Each constant's comment names the rules that catch it, as Breaks does:
// the comment is what a reader of the broken code looks up.
func TestCommentsNameTheRulesThatCatch(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "failpoint.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			docs[v.Names[0].Name] = v.Doc.Text()
		}
	}
	for _, b := range Breaks {
		doc := ""
		for name, text := range docs { // highest_seen documents HighestSeen
			if strings.EqualFold(strings.ReplaceAll(b.Name, "_", ""), name) {
				doc = text
			}
		}
		if doc == "" {
			t.Errorf("%s: no documented constant", b.Name)
			continue
		}
		_, caught, ok := strings.Cut(doc, "Caught by ")
		for _, r := range b.CaughtBy {
			if !ok || !strings.Contains(caught, r) {
				t.Errorf("%s: the comment's \"Caught by\" does not name %s", b.Name, r)
			}
		}
	}
}
