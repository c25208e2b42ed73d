package postgres_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/tokens"
)

// loadGooseFixture creates schema as goose left it at version 5
// (testdata/goose_v5.sql).
func loadGooseFixture(t *testing.T, schema string) {
	t.Helper()
	dump, err := os.ReadFile("testdata/goose_v5.sql")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, strings.ReplaceAll(string(dump), "__SCHEMA__", schema)); err != nil {
		t.Fatalf("load goose fixture: %v", err)
	}
}

type migrationRow struct {
	ID      int32
	Version int64
	Applied bool
}

func migrationRows(t *testing.T, s *postgres.Store) []migrationRow {
	t.Helper()
	rows, err := s.Pool().Query(t.Context(), `SELECT id, version_id, is_applied FROM fencegw_migrations ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[migrationRow])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A database that goose migrated (fencegw before migrate.go had its own
// runner) is picked up where goose left it: the newer migrations are
// applied and recorded after goose's rows, the data stays, and opening it
// again applies nothing.
func TestMigrateGooseDatabase(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	loadGooseFixture(t, schema)

	s := pgtest.Open(t, schema, postgres.Options{})
	// goose's rows (its version 0, then 1–5), then one row per newer
	// migration file, in order.
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) < 7 {
		t.Fatalf("migration files: %v, %v", files, err)
	}
	var want []migrationRow
	for v := range len(files) + 1 {
		want = append(want, migrationRow{int32(v + 1), int64(v), true})
	}
	if got := migrationRows(t, s); !slices.Equal(got, want) {
		t.Fatalf("fencegw_migrations after migrating goose's version 5:\n got %v\nwant %v", got, want)
	}
	// The fixture's fence row: a token issued under goose is never reissued.
	l, err := s.Grant(t.Context(), tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "fixture", Holder: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if l.Token != 42 {
		t.Fatalf("token %d after the fixture's 41", l.Token)
	}
	// Migration 7's table is in use.
	if _, _, err := s.BeginKey(t.Context(), tokens.KeyBegin{Scope: tokens.KeyScope{Resource: "fixture", Upstream: "u", Key: "k"},
		Attempt: "a", Fingerprint: "f", Token: l.Token, InFlight: time.Minute, Window: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	again := pgtest.Open(t, schema, postgres.Options{})
	if got := migrationRows(t, again); !slices.Equal(got, want) {
		t.Fatalf("fencegw_migrations after opening again:\n got %v\nwant %v", got, want)
	}
}

// The version table this runner creates has goose's layout, so that a
// fencegw that still migrates with goose can open a database a newer one
// created.
func TestMigrationTableHasGooseLayout(t *testing.T) {
	t.Parallel()
	gooseSchema := pgtest.NewSchema(t)
	loadGooseFixture(t, gooseSchema)
	fresh := pgtest.OpenFresh(t)

	layout := func(s *postgres.Store, schema string) []string {
		rows, err := s.Pool().Query(t.Context(), `SELECT column_name || ' ' || data_type || ' ' || is_nullable || ' ' ||
				coalesce(column_default, '') || ' ' || is_identity || ' ' || coalesce(identity_generation, '')
			FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'fencegw_migrations'
			ORDER BY ordinal_position`, schema)
		if err != nil {
			t.Fatal(err)
		}
		cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return cols
	}
	var freshSchema string
	if err := fresh.Pool().QueryRow(t.Context(), `SELECT current_schema()`).Scan(&freshSchema); err != nil {
		t.Fatal(err)
	}
	want, got := layout(fresh, gooseSchema), layout(fresh, freshSchema)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Fatalf("fencegw_migrations columns:\n got %q\nwant %q (goose's)", got, want)
	}
	// goose's first row, version 0, then one per migration.
	rows := migrationRows(t, fresh)
	if len(rows) < 2 || rows[0] != (migrationRow{1, 0, true}) || rows[1] != (migrationRow{2, 1, true}) {
		t.Fatalf("fresh fencegw_migrations: %v", rows)
	}
}

// A migration missing below the newest applied version means the schema is
// not what its versions say: Open refuses instead of guessing.
func TestMigrateRefusesAMissingOlderVersion(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	loadGooseFixture(t, schema)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DELETE FROM `+pgx.Identifier{schema, "fencegw_migrations"}.Sanitize()+` WHERE version_id = 3`); err != nil {
		t.Fatal(err)
	}
	s, err := postgres.Open(ctx, pgtest.URL(), postgres.Options{Schema: schema})
	if err == nil {
		_ = s.Close()
		t.Fatal("Open migrated a database whose version 3 is missing below version 5")
	}
	if !strings.Contains(err.Error(), "00003_retention.sql") {
		t.Fatalf("err = %v, want it to name 00003_retention.sql", err)
	}
}

// A migration rolled back with goose (its Down run, then a row with
// is_applied false) is applied again at the next start: a version's state
// is its newest row, not whether any row names it.
func TestMigrateReappliesARolledBackVersion(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	s := pgtest.Open(t, schema, postgres.Options{})
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migrations: %v %v", files, err)
	}
	slices.Sort(files)
	newest := files[len(files)-1]
	src, err := os.ReadFile(newest)
	if err != nil {
		t.Fatal(err)
	}
	_, down, ok := strings.Cut(string(src), "-- +goose Down")
	if !ok || strings.TrimSpace(down) == "" {
		t.Fatalf("%s has no Down section", newest)
	}
	version := migrationRows(t, s)[len(migrationRows(t, s))-1].Version
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// What goose down does: the Down SQL and a row recording it.
	if _, err := conn.Exec(ctx, `SET search_path TO `+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, down); err != nil {
		t.Fatalf("down of %s: %v", newest, err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO fencegw_migrations (version_id, is_applied) VALUES ($1, false)`, version); err != nil {
		t.Fatal(err)
	}

	again := pgtest.Open(t, schema, postgres.Options{})
	rows := migrationRows(t, again)
	if last := rows[len(rows)-1]; last.Version != version || !last.Applied {
		t.Fatalf("newest row %+v, want version %d applied again (%s)", last, version, newest)
	}
	// The store works on the re-created schema: a grant and its history.
	l, err := again.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.History(ctx, l.Resource, 10); err != nil {
		t.Fatalf("history after the re-applied migration: %v", err)
	}
}
