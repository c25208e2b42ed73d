package postgres_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// twoReplicas opens two Stores on one schema: two gateways.
func twoReplicas(t *testing.T) (*postgres.Store, *postgres.Store) {
	schema := pgtest.NewSchema(t)
	return pgtest.Open(t, schema, postgres.Options{}), pgtest.Open(t, schema, postgres.Options{})
}

// acquireAsync starts a lock request and reports its outcome on a channel.
func acquireAsync(ctx context.Context, lock func(context.Context, string) (func(), error), resource string) <-chan func() {
	ch := make(chan func(), 1)
	go func() {
		unlock, err := lock(ctx, resource)
		if err != nil {
			close(ch)
			return
		}
		ch <- unlock
	}()
	return ch
}

func mustNotHappen(t *testing.T, ch <-chan func(), what string) {
	t.Helper()
	select {
	case u, ok := <-ch:
		if ok {
			u()
		}
		t.Fatalf("%s happened too early", what)
	case <-time.After(200 * time.Millisecond):
	}
}

func mustHappen(t *testing.T, ch <-chan func(), what string) func() {
	t.Helper()
	select {
	case u, ok := <-ch:
		if !ok {
			t.Fatalf("%s failed", what)
		}
		return u
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not happen", what)
	}
	return nil
}

// The advisory lock per write (postgres.Store as a tokens.Locker) and the
// fence kept across writes (postgres.Fence, the Locker both PostgreSQL modes
// serve with: the Redis mode locks in PostgreSQL too) pass the Locker
// suite, with each replica on its own pool of one schema.
func TestLockerConformance(t *testing.T) {
	pgtest.Require(t)
	storagetest.RunLocker(t, storagetest.LockerHarness{
		Replicas: func(t *testing.T, n int) []tokens.Locker {
			schema := pgtest.NewSchema(t)
			out := make([]tokens.Locker, n)
			for i := range out {
				out[i] = pgtest.Open(t, schema, postgres.Options{})
			}
			return out
		},
	})
}

func TestFenceLockerConformance(t *testing.T) {
	pgtest.Require(t)
	storagetest.RunLocker(t, storagetest.LockerHarness{
		Replicas: func(t *testing.T, n int) []tokens.Locker {
			var out []tokens.Locker
			for _, r := range pgtest.FenceReplicas(t, n, storagetest.FenceOptions{}, nil) {
				out = append(out, r.Locker)
			}
			return out
		},
		// A replica asked to give its fence up does so even if the
		// exclusive request gives up first: the writes that queued on it
		// meanwhile wait for the ones in flight (bounded by the forward
		// timeout), then take the fence anew.
		YieldIsFinal: true,
	})
}

func TestLockerSessionKilled(t *testing.T) {
	t.Parallel()
	a, b := twoReplicas(t)
	ctx := t.Context()
	held, err := a.SharedLock(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	ex := acquireAsync(ctx, b.Exclusive, "r")
	mustNotHappen(t, ex, "exclusive while shared held")

	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", postgres.LockPID(held)); err != nil {
		t.Fatal(err)
	}
	// The database freed the lock with the session (the documented limit)...
	mustHappen(t, ex, "exclusive after the shared holder's session died")()
	// ...and the holder learns it at unlock.
	if err := held.Unlock(); !errors.Is(err, tokens.ErrUnavailable) {
		t.Fatalf("Unlock of a lost lock: %v, want ErrUnavailable", err)
	}
	if err := held.Unlock(); !errors.Is(err, tokens.ErrUnavailable) {
		t.Fatalf("second Unlock: %v", err)
	}
	// The pool is healthy afterwards.
	u, err := a.Exclusive(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	u()
}

func TestRejectionFanOut(t *testing.T) {
	t.Parallel()
	a, b := twoReplicas(t)
	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan tokens.Rejection, 4)
	ready := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		done <- b.ListenReady(ctx, func(r tokens.Rejection) { got <- r }, func() { once.Do(func() { close(ready) }) })
	}()
	<-ready
	want := tokens.Rejection{ID: 7, At: time.Now().UTC().Truncate(time.Microsecond), Resource: "r", Code: tokens.CodeStaleToken,
		Token: 1, CurrentToken: 2, Holder: "h", LeaseHint: "fl_abcdef…", Method: "PUT", Upstream: "u", Path: "/x"}
	if err := a.PublishRejection(ctx, want); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if !r.At.Equal(want.At) {
			t.Fatalf("at %v, want %v", r.At, want.At)
		}
		r.At = want.At
		if r != want {
			t.Fatalf("got %+v, want %+v", r, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no rejection arrived")
	}

	// Kill the listening session: the listener reconnects and goes on.
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1", "LISTEN \""+b.Channel()+"\""); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for delivered := false; !delivered; {
		if err := a.PublishRejection(ctx, want); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
			delivered = true
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("no rejection after the listener's session was killed")
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("ListenRejections returned %v", err)
	}
}

// A batch of rejections crosses to another replica packed into few
// notifications, whole and in order.
func TestRejectionFanOutBatch(t *testing.T) {
	t.Parallel()
	a, b := twoReplicas(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	got := make(chan tokens.Rejection, 1000)
	ready := make(chan struct{})
	var once sync.Once
	go func() {
		_ = b.ListenReady(ctx, func(r tokens.Rejection) { got <- r }, func() { once.Do(func() { close(ready) }) })
	}()
	<-ready
	var batch []tokens.Rejection
	for i := range 500 {
		batch = append(batch, tokens.Rejection{ID: int64(i + 1), At: time.Now().UTC(), Resource: "r", Code: tokens.CodeStaleToken,
			Token: 1, CurrentToken: 2, Holder: "h", Method: "PUT", Upstream: "u", Path: strings.Repeat("/x", 20)})
	}
	if err := a.PublishRejections(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		select {
		case r := <-got:
			if r.ID != int64(i+1) {
				t.Fatalf("rejection %d arrived as id %d", i+1, r.ID)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of 500 rejections arrived", i)
		}
	}
}
