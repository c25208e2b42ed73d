package torture

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/tokens"
)

// store-refuses-drain in the PostgreSQL modes: while the nemesis holds a
// resource's fences row, the store's drain of that resource fails (it is
// cancelled, not left to wait out the caller's deadline) and a grant of
// another resource is not disturbed; once the row is let go the drain is
// recorded. Against the shared server, in a schema of its own: the torture
// itself is not run here (its nemesis restarts the server).
func TestStoreRefusesDrainHoldsTheRow(t *testing.T) {
	schema := pgtest.NewSchema(t)
	store := pgtest.Open(t, schema, postgres.Options{})
	ctx := context.Background()
	grant := func(res string) {
		t.Helper()
		if _, err := store.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: res, Holder: "w", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	grant("held")
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	n := &nemesis{pg: &Postgres{URL: u.String()}, logf: t.Logf}

	heal, err := n.holdFencesRow(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	healed := false
	defer func() {
		if !healed {
			heal()
		}
	}()
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = store.Drain(dctx, "held", time.Second)
	cancel()
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain of a resource whose row the nemesis holds: %v, want it refused", err)
	}
	grant("other") // another resource's row is not held
	heal()
	healed = true
	if err := store.Drain(ctx, "held", time.Second); err != nil {
		t.Fatalf("drain once the row is let go: %v", err)
	}
}
