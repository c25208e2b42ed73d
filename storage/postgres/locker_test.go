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

func TestLockerSharedBlocksExclusiveAcrossReplicas(t *testing.T) {
	t.Parallel()
	a, b := twoReplicas(t)
	ctx := t.Context()
	s1, err := a.Shared(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	s2, err := b.Shared(ctx, "r") // shared holders coexist across replicas
	if err != nil {
		t.Fatal(err)
	}
	other, err := b.Exclusive(ctx, "another") // other resources are independent
	if err != nil {
		t.Fatal(err)
	}
	other()
	ex := acquireAsync(ctx, b.Exclusive, "r")
	mustNotHappen(t, ex, "exclusive while two shared holders")
	s1()
	mustNotHappen(t, ex, "exclusive while one shared holder")
	s2()
	unlock := mustHappen(t, ex, "exclusive after the shared holders left")
	sh := acquireAsync(ctx, a.Shared, "r")
	mustNotHappen(t, sh, "shared while exclusive held")
	unlock()
	mustHappen(t, sh, "shared after exclusive")()
}

// PostgreSQL's lock queue gives writer preference: a waiting exclusive
// request blocks later shared requests although the lock is only shared-held.
func TestLockerWriterPreference(t *testing.T) {
	t.Parallel()
	a, b := twoReplicas(t)
	ctx := t.Context()
	s1, err := a.Shared(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	ex := acquireAsync(ctx, b.Exclusive, "r")
	mustNotHappen(t, ex, "exclusive while shared held")
	late := acquireAsync(ctx, a.Shared, "r")
	lateB := acquireAsync(ctx, b.Shared, "r")
	mustNotHappen(t, late, "a later shared overtaking the waiting exclusive")
	s1()
	unlock := mustHappen(t, ex, "exclusive")
	mustNotHappen(t, lateB, "a later shared during the exclusive")
	unlock()
	mustHappen(t, late, "later shared on replica a")()
	mustHappen(t, lateB, "later shared on replica b")()
}

func TestLockerDeadline(t *testing.T) {
	t.Parallel()
	a, b := twoReplicas(t)
	s1, err := a.Shared(t.Context(), "r")
	if err != nil {
		t.Fatal(err)
	}
	defer s1()
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err = b.Exclusive(ctx, "r")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exclusive past its deadline: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 2*time.Second {
		t.Fatalf("gave up after %v", d)
	}
	// A cancelled (not timed out) wait is an error too, and the lock pool
	// stays usable.
	cctx, ccancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, ccancel)
	if _, err := b.Exclusive(cctx, "r"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Exclusive: %v", err)
	}
	s1()
	u, err := b.Exclusive(t.Context(), "r")
	if err != nil {
		t.Fatal(err)
	}
	u()
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
