package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fencegw/fencegw/internal/failpoint"
	"github.com/fencegw/fencegw/torture"
)

// userDocs is the README and every page of docs/, by path.
func userDocs(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, "../../README.md")
	docs := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs[strings.TrimPrefix(p, "../../")] = string(b)
	}
	return docs
}

var numberWords = []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
	"ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"}

// number reads "8" or "eight" (any case); -1 if it is neither.
func number(s string) int {
	if n, err := strconv.Atoi(s); err == nil {
		return n
	}
	if i := slices.Index(numberWords, strings.ToLower(s)); i >= 0 {
		return i
	}
	return -1
}

// countsOf finds every "<number> <noun>" in the docs (the noun a regular
// expression) and reports those whose number is not want.
func countsOf(t *testing.T, docs map[string]string, noun string, want int) (found int) {
	t.Helper()
	re := regexp.MustCompile(`(?i)\b([0-9]+|` + strings.Join(numberWords, "|") + `)\s+` + noun)
	for path, text := range docs {
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			found++
			if n := number(m[1]); n != want {
				t.Errorf("%s says %q; the code has %d", path, strings.Join(strings.Fields(m[0]), " "), want)
			}
		}
	}
	return found
}

// TestDocsCountsMatchTheCode: the figures the README and docs/ give of
// things the code enumerates (broken builds, PostgreSQL tables, serve
// flags, torture rules) are the code's, and the lists that name them name
// them all.
func TestDocsCountsMatchTheCode(t *testing.T) {
	docs := userDocs(t)

	// Broken builds: internal/failpoint.Breaks is the list the torture runs.
	if n := countsOf(t, docs, `(?:deliberately\s+)?broken\s+builds`, len(failpoint.Breaks)); n == 0 {
		t.Error("no doc says how many broken builds there are (README: \"checks that N deliberately broken builds are caught\")")
	}
	rel := docs["docs/reliability.md"]
	for _, b := range failpoint.Breaks {
		if !strings.Contains(rel, "| `fencegw_break_"+b.Name+"` |") {
			t.Errorf("docs/reliability.md's table of broken builds has no row for fencegw_break_%s", b.Name)
		}
	}
	if rows := regexp.MustCompile("(?m)^\\| `fencegw_break_").FindAllString(rel, -1); len(rows) != len(failpoint.Breaks) {
		t.Errorf("docs/reliability.md's table of broken builds has %d rows; failpoint.Breaks has %d", len(rows), len(failpoint.Breaks))
	}

	// Torture rules: torture.Rules, each a row of docs/reliability.md's table.
	for _, r := range torture.Rules {
		if !strings.Contains(rel, "| `"+r+"` |") {
			t.Errorf("docs/reliability.md's table of rules has no row for %s", r)
		}
	}
	countsOf(t, docs, `(?:torture\s+)?rules\b`, len(torture.Rules))

	// PostgreSQL tables: those the migrations create, and the migrations'
	// own table. A DBA granting permissions needs every one.
	tables := postgresTables(t)
	readme := docs["README.md"]
	m := regexp.MustCompile(`(?s)The (\w+) tables \((.*?)\) are created`).FindStringSubmatch(readme)
	if m == nil {
		t.Fatal("the README does not list the PostgreSQL tables (\"The N tables (`a`, `b`, …) are created\")")
	}
	if n := number(m[1]); n != len(tables) {
		t.Errorf("the README says %q tables; the migrations create %d: %v", m[1], len(tables), tables)
	}
	var listed []string
	for _, name := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(m[2], -1) {
		listed = append(listed, name[1])
	}
	slices.Sort(listed)
	if !slices.Equal(listed, tables) {
		t.Errorf("the README lists the tables %v; the migrations create %v", listed, tables)
	}
	countsOf(t, docs, `(?:PostgreSQL\s+)?tables\b`, len(tables))

	// Serve flags (each one's documentation is TestEveryServeFlagIsDocumented's).
	countsOf(t, docs, `(?:serve\s+)?flags\b`, len(serveFlagNames(t)))
}

// postgresTables is every table storage/postgres creates: CREATE TABLE in
// its migrations, and its migrations' own table (migrate.go), sorted.
func postgresTables(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../storage/postgres/migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations found: %v", err)
	}
	create := regexp.MustCompile(`(?i)CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_]+)`)
	var tables []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range create.FindAllStringSubmatch(string(b), -1) {
			tables = append(tables, m[1])
		}
	}
	src, err := os.ReadFile("../../storage/postgres/migrate.go")
	if err != nil {
		t.Fatal(err)
	}
	own := regexp.MustCompile(`const migrationTable = "([a-z_]+)"`).FindSubmatch(src)
	if own == nil {
		t.Fatal("storage/postgres/migrate.go has no migrationTable constant")
	}
	tables = append(tables, string(own[1]))
	slices.Sort(tables)
	return slices.Compact(tables)
}
