package postgres

import (
	"strings"
	"testing"
)

// Every embedded migration parses, and the versions run 1, 2, ... without
// a gap: a gap would be a file lost, which pending cannot tell from one
// not yet written.
func TestEmbeddedMigrations(t *testing.T) {
	ms, err := embeddedMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 {
		t.Fatal("no migrations embedded")
	}
	for i, m := range ms {
		if m.version != int64(i+1) {
			t.Errorf("%s: version %d at position %d", m.name, m.version, i+1)
		}
		if strings.Contains(m.up, "+goose") {
			t.Errorf("%s: the up section holds an annotation: %q", m.name, m.up)
		}
	}
}

func TestUpSection(t *testing.T) {
	up, err := upSection("-- +goose Up\nCREATE TABLE a (x int);\n-- comment\nCREATE INDEX ai ON a (x);\n\n-- +goose Down\nDROP TABLE a;\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "CREATE TABLE a (x int);\n-- comment\nCREATE INDEX ai ON a (x);\n\n"; up != want {
		t.Fatalf("up = %q, want %q", up, want)
	}
	for _, src := range []string{
		"-- +goose Up\n-- +goose StatementBegin\nCREATE FUNCTION f() ...;\n-- +goose StatementEnd\n",
		"-- +goose NO TRANSACTION\n-- +goose Up\nCREATE INDEX CONCURRENTLY i ON a (x);\n",
		"CREATE TABLE a (x int);\n", // no Up annotation: nothing to run
	} {
		if _, err := upSection(src); err == nil {
			t.Errorf("upSection accepted %q", src)
		}
	}
}

func TestPending(t *testing.T) {
	ms := []migration{{version: 1, name: "1"}, {version: 2, name: "2"}, {version: 3, name: "3"}}
	names := func(ms []migration) string {
		var s []string
		for _, m := range ms {
			s = append(s, m.name)
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct {
		applied []int64
		want    string
	}{
		{nil, "1 2 3"},
		{[]int64{0}, "1 2 3"},
		{[]int64{0, 1}, "2 3"},
		{[]int64{0, 1, 2, 3}, ""},
		{[]int64{0, 1, 2, 3, 4}, ""}, // a newer fencegw migrated it
	} {
		got, err := pending(ms, tc.applied)
		if err != nil || names(got) != tc.want {
			t.Errorf("pending(%v) = %v, %v; want %q", tc.applied, names(got), err, tc.want)
		}
	}
	if got, err := pending(ms, []int64{0, 1, 3}); err == nil {
		t.Errorf("pending with 2 missing below 3 = %v, want an error", names(got))
	}
}
