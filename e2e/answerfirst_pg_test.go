package e2e

// A fenced write's answer does not wait for a store that refuses its
// records: the end of a keyed write (its unknown outcome, its answer) and
// a refused write's entry in the rejection log are recorded once the
// store takes them, and meanwhile a retry with the key is refused, never
// forwarded again.

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/gateway"
	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// refusedFor is how long the store refuses, from the moment it starts: past
// the longest the answers may wait for it (the answer's record, a second),
// short of the statement timeout that would end the wait anyway.
const refusedFor = 4 * time.Second

// promptly is the longest an answer may take while the store refuses:
// well under the store's own timeout, which the answer waited for before.
const promptly = postgres.DefaultStatementTimeout / 2

// In PostgreSQL, a session of its own holds the key's row FOR UPDATE (a
// long transaction, a migration) from the moment the write reaches the
// upstream: the record of the write's end waits on it. The client's answer
// comes back at once all the same; a quick retry is refused (in progress,
// or store_unavailable while its own begin waits on the row), and once the
// row is free it is refused as unknown, or replayed: the upstream sees the
// key once.
func TestKeyedWriteAnswersBeforeTheStore(t *testing.T) {
	t.Parallel()
	pgtest.Require(t)
	schema := pgtest.NewSchema(t)
	up := newUpstream(t)
	o := options{forwardTimeout: 300 * time.Millisecond, drainPeriod: 300 * time.Millisecond}
	g := startWith(t, pgMode(t, storagemode.Config{Schema: schema}, 0), map[string]string{"payments": up.URL}, o)
	res := "acct:answerfirst"
	lease := acquire(t, g.URL, res, "worker-A", time.Minute)
	charge := func(key string) answer {
		return do(t, "POST", g.URL+"/v1/proxy/payments/charges", `{"amount":500}`,
			gateway.HeaderLease, lease.LeaseID, gateway.HeaderIdempotencyKey, `"`+key+`"`)
	}

	healed := map[string]chan struct{}{"timeout": make(chan struct{}), "answer": make(chan struct{})}
	refusing := make(chan error, 2)
	up.setHold(func(a arrival) {
		key := a.Header.Get(gateway.HeaderIdempotencyKey)
		for k, ch := range healed {
			if key != `"`+k+`"` {
				continue
			}
			heal, err := holdRow(schema, "idempotency_keys", "key", k)
			refusing <- err
			go func() {
				if err == nil {
					time.Sleep(refusedFor) // the fault's length, not a wait for an event
					heal()
				}
				close(ch)
			}()
			if k == "timeout" {
				time.Sleep(2 * o.forwardTimeout) // the charge lands after the 504
			}
		}
	})

	for _, k := range []string{"timeout", "answer"} {
		t.Run(k, func(t *testing.T) {
			sent := time.Now()
			first := charge(k)
			answered := time.Since(sent)
			if err := <-refusing; err != nil {
				t.Fatal(err)
			}
			if k == "timeout" {
				wantProblem(t, first, http.StatusGatewayTimeout, "upstream_timeout")
			} else if first.Status != http.StatusOK {
				t.Fatalf("first attempt: %d %s", first.Status, first.Body)
			}
			if answered >= promptly {
				t.Errorf("the first attempt's answer came %v after it was sent: it waited for the store", answered)
			}
			// At once, while the row is held: refused, not forwarded.
			again := charge(k)
			if !refusedRetry(again) {
				t.Fatalf("retry while the store refuses: %d %s", again.Status, again.Body)
			}
			<-healed[k]
			deadline := time.Now().Add(10 * time.Second)
			for {
				again = charge(k)
				if k == "timeout" && again.Status == http.StatusConflict && again.Problem.Code == "idempotency_outcome_unknown" {
					break
				}
				if k == "answer" && again.Status == http.StatusOK {
					if again.Header.Get(gateway.HeaderReplayed) != "true" || string(again.Body) != string(first.Body) {
						t.Fatalf("retry after the store came back: %d %q replayed=%q, want %q replayed", again.Status, again.Body, again.Header.Get(gateway.HeaderReplayed), first.Body)
					}
					break
				}
				if !refusedRetry(again) || time.Now().After(deadline) {
					t.Fatalf("retry after the store came back: %d %s", again.Status, again.Body)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if n := keyed(up, k); n != 1 {
				t.Fatalf("the key reached the upstream %d times, want 1", n)
			}
		})
	}
}

// refusedRetry: a retry whose key's record is not in yet is told to come
// back (its record in progress, or its own begin cut short), and nothing
// is forwarded.
func refusedRetry(a answer) bool {
	return a.Status == http.StatusConflict && a.Problem.Code == "idempotency_key_in_progress" ||
		a.Status == http.StatusServiceUnavailable && a.Problem.Code == "store_unavailable"
}

// A stale write's refusal does not wait for its entry in the rejection log
// while the log's table is locked (SHARE: inserts wait), and the entry is
// in the log once the lock is gone.
func TestRefusalAnswersBeforeItsRecord(t *testing.T) {
	t.Parallel()
	pgtest.Require(t)
	schema := pgtest.NewSchema(t)
	up := newUpstream(t)
	o := options{}
	g := startWith(t, pgMode(t, storagemode.Config{Schema: schema}, 0), map[string]string{"svc": up.URL}, o)
	res := "refused-first"
	a := acquire(t, g.URL, res, "A", time.Minute)
	if r := do(t, "DELETE", g.URL+"/v1/leases/"+a.LeaseID, nil); r.Status != http.StatusNoContent {
		t.Fatalf("release: %d %s", r.Status, r.Body)
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+pgx.Identifier{schema, "rejections"}.Sanitize()+` IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	locked := time.Now()
	sent := time.Now()
	got := write(t, g.URL, "svc", "/x", a, "A")
	answered := time.Since(sent)
	wantProblem(t, got, http.StatusConflict, "lease_released")
	if answered >= promptly {
		t.Errorf("the refusal came %v after the write was sent: it waited for its record", answered)
	}
	time.Sleep(time.Until(locked.Add(refusedFor))) // the fault's length, not a wait for an event
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rs := rejections(t, g.URL, "?resource="+res)
		if len(rs.Items) == 1 && rs.Items[0].Code == "lease_released" && rs.Items[0].Token == a.Token {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refusal is not in the rejection log: %+v", rs.Items)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := len(up.seen()); n != 0 {
		t.Fatalf("the upstream saw %d writes", n)
	}
}

// holdRow takes table's rows where column = value FOR UPDATE on a
// connection of its own, as a long transaction would; heal lets them go.
func holdRow(schema, table, column, value string) (func(), error) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		var n int
		err = tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+pgx.Identifier{schema, table}.Sanitize()+
			` WHERE `+pgx.Identifier{column}.Sanitize()+` = $1 FOR UPDATE) r`, value).Scan(&n)
		if err == nil && n != 1 {
			err = fmt.Errorf("%d %s rows where %s = %q", n, table, column, value)
		}
	}
	if err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("lock the %s row: %w", table, err)
	}
	return func() {
		_ = tx.Rollback(ctx)
		_ = conn.Close(ctx)
	}, nil
}
