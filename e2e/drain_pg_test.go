package e2e

// A drain the store cannot record, in the PostgreSQL modes: the timed-out
// write's fence is held until the drain is recorded or has passed.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// A's write reaches the upstream, which applies it only after the forward
// timed out. At the moment of the timeout a session of its own holds the
// resource's fences row (a long transaction, a migration): the drain's
// UPDATE waits and then fails on the statement timeout, and the row is free
// again a moment later. A's 504 does not wait for the store; no grant of
// the resource returns before the drain period has passed from the
// timeout; and B's first write lands after A's. (Releasing the fence when
// the record failed let B be granted as soon as the row was free, and B's
// write landed before A's.)
func TestStoreRefusesDrain(t *testing.T) {
	for _, redis := range []bool{false, true} {
		name := "postgres"
		if redis {
			name = "postgres-redis"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testStoreRefusesDrain(t, redis)
		})
	}
}

func testStoreRefusesDrain(t *testing.T, redis bool) {
	pgtest.Require(t)
	const (
		forward = 300 * time.Millisecond
		drain   = 7 * time.Second
		// The row is held past the statement timeout that cuts the drain's
		// UPDATE short, then freed well before A's write lands.
		rowHeld = postgres.DefaultStatementTimeout + forward + 500*time.Millisecond
		// A's write lands before the drain started at its timeout ends.
		landsAfter = drain - 500*time.Millisecond
	)
	schema := pgtest.NewSchema(t)
	res := "refused-drain"

	// The upstream holds A's write (and takes the row lock as it arrives,
	// so that the lock is in place when the forward times out).
	up := newUpstream(t)
	rowLocked, rowFreed := make(chan error, 1), make(chan struct{})
	var landed time.Time
	aLanded := make(chan struct{})
	up.setHold(func(a arrival) {
		if a.Body != "A" {
			return
		}
		rowLocked <- holdFenceRow(schema, res, rowHeld, rowFreed)
		time.Sleep(landsAfter) // the delay is the fault, not a wait for an event
		landed = time.Now()
		close(aLanded)
	})
	o := options{forwardTimeout: forward, drainPeriod: drain, grantWait: 3 * drain}
	var gws []*gw
	for i := range 2 {
		cfg := storagemode.Config{Schema: schema}
		if redis {
			requireRedis(t)
			cfg.Redis, cfg.RedisPrefix = redisURL(), fmt.Sprintf("fencegw-e2e:%s:", schema)
		}
		gws = append(gws, startWith(t, openMode(t, cfg, i, o), map[string]string{"svc": up.URL}, o))
	}

	a := acquire(t, gws[0].URL, res, "A", 2*time.Second)
	sent := time.Now()
	got := write(t, gws[0].URL, "svc", "/x", a, "A")
	answered := time.Since(sent)
	if err := <-rowLocked; err != nil {
		t.Fatal(err)
	}
	wantProblem(t, got, http.StatusGatewayTimeout, "upstream_timeout")
	if answered >= postgres.DefaultStatementTimeout {
		t.Errorf("A's 504 came %v after its write was sent: it waited for the store", answered)
	}

	// B asks at once, on the other replica, and waits as long as it takes.
	b := do(t, "POST", gws[1].URL+"/v1/leases", map[string]any{"resource": res, "holder": "B", "ttl_ms": 10000, "wait_ms": (3 * drain).Milliseconds()})
	if b.Status != http.StatusCreated {
		t.Fatalf("B's acquire: %d %s", b.Status, b.Body)
	}
	var bl leaseJSON
	if err := json.Unmarshal(b.Body, &bl); err != nil {
		t.Fatal(err)
	}
	// The lease's grant time is the database's clock, on this host.
	granted := bl.ExpiresAt.Add(-time.Duration(bl.TTLms) * time.Millisecond)
	if earliest := sent.Add(forward + drain); granted.Before(earliest) {
		t.Errorf("B was granted %v before the drain period from A's timeout had passed", earliest.Sub(granted))
	}
	if w := write(t, gws[1].URL, "svc", "/x", bl, "B"); w.Status != http.StatusOK {
		t.Fatalf("B's write: %d %s", w.Status, w.Body)
	}
	<-rowFreed
	<-aLanded
	for _, ar := range up.seen() {
		if ar.Body == "B" && ar.At.Before(landed) {
			t.Errorf("B's write (token %d) arrived %v before A's older write (token %d) landed", bl.Token, landed.Sub(ar.At), a.Token)
		}
	}
}

// holdFenceRow takes resource's fences row FOR UPDATE on a connection of
// its own, as a long transaction would, and lets it go after d (closing
// freed). It returns once the row is held.
func holdFenceRow(schema, resource string, d time.Duration, freed chan<- struct{}) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		var n int
		err = tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+pgx.Identifier{schema, "fences"}.Sanitize()+
			` WHERE resource = $1 FOR UPDATE) r`, resource).Scan(&n)
		if err == nil && n != 1 {
			err = fmt.Errorf("%d fences rows for %q", n, resource)
		}
	}
	if err != nil {
		_ = conn.Close(ctx)
		return fmt.Errorf("lock the fences row: %w", err)
	}
	go func() {
		time.Sleep(d)
		_ = tx.Rollback(ctx)
		_ = conn.Close(ctx)
		close(freed)
	}()
	return nil
}
