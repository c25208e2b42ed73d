package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// serveFlagNames reads the flag names parseServe defines from config.go's
// source (fs.StringVar(&x, "name", ...), fs.Int("name", ...), ...), so that
// a flag added there without documentation fails the test below.
func serveFlagNames(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "config.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); !ok || id.Name != "fs" {
			return true
		}
		arg := 0 // fs.Int("name", ...), fs.String("name", ...)
		if strings.HasSuffix(sel.Sel.Name, "Var") {
			arg = 1 // fs.StringVar(&v, "name", ...), fs.Var(v, "name", ...)
		}
		if len(call.Args) <= arg {
			return true
		}
		if lit, ok := call.Args[arg].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			name, _ := strconv.Unquote(lit.Value)
			names = append(names, name)
		}
		return true
	})
	if len(names) < 20 {
		t.Fatalf("found only %d flags in config.go: the parser missed their shape", len(names))
	}
	return names
}

// Every serve flag is in --help and in the README's synopsis and table.
func TestEveryServeFlagIsDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(readme)
	start := strings.Index(conf, "## Configuration")
	if start < 0 {
		t.Fatal("README has no Configuration section")
	}
	conf = conf[start:]
	if end := strings.Index(conf[3:], "\n## "); end >= 0 {
		conf = conf[:end+3]
	}
	synopsis, _, _ := strings.Cut(conf[strings.Index(conf, "```")+3:], "```")
	for _, name := range serveFlagNames(t) {
		flag := "--" + name
		if !strings.Contains(usage, flag+" ") && !strings.Contains(usage, flag+"\n") {
			t.Errorf("%s is not in the --help text (main.go usage)", flag)
		}
		if !strings.Contains(synopsis, "["+flag) && !strings.Contains(synopsis, flag+" ") {
			t.Errorf("%s is not in the README's configuration synopsis", flag)
		}
		if !strings.Contains(conf, "| `"+flag) && !strings.Contains(conf, ", `"+flag) {
			t.Errorf("%s is not in the README's flag table", flag)
		}
	}
}
