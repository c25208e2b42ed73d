package tokens_test

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// An acquire whose client left while it waited for the resource's lock is
// asked, once it holds the lock and before the store records the grant,
// whether its client is still there; gone, it makes no lease. Its context
// is never cancelled here: the watch that would cancel it has not heard
// the client go yet (a process resumed after a pause hears both at once).
func TestAcquireAsksForItsClientUnderTheLock(t *testing.T) {
	store, err := bolt.Open(t.TempDir()+"/fencegw.db", bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	locker := tokens.NewLocalLocker()
	svc := tokens.New(tokens.Config{Store: store, Locker: locker, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx := t.Context()
	a, err := svc.Acquire(ctx, tokens.AcquireRequest{Resource: "r", Holder: "a", TTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(a.ExpiresAt.Add(20 * time.Millisecond)))

	gone := errors.New("the client left")
	for _, tc := range []struct {
		name  string
		asked error
		token int64 // the resource's token after the acquire
	}{
		{"gone", gone, a.Token},
		{"there", nil, a.Token + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A write of the previous token in flight: the grant waits for
			// the exclusive lock.
			unlock, err := locker.Exclusive(ctx, "r")
			if err != nil {
				t.Fatal(err)
			}
			var unlocked time.Time
			asks := 0
			done := make(chan error, 1)
			go func() {
				_, err := svc.Acquire(ctx, tokens.AcquireRequest{Resource: "r", Holder: "b", TTL: time.Minute,
					ClientGone: func() error {
						asks++
						if unlocked.IsZero() {
							t.Error("asked before the lock was free")
						}
						return tc.asked
					}})
				done <- err
			}()
			time.Sleep(100 * time.Millisecond)
			unlocked = time.Now()
			unlock()
			err = <-done
			if tc.asked != nil && !errors.Is(err, tc.asked) || tc.asked == nil && err != nil {
				t.Fatalf("Acquire: %v; want %v", err, tc.asked)
			}
			if asks != 1 {
				t.Fatalf("the client was asked %d times; want once", asks)
			}
			if r, err := svc.Resource(ctx, "r"); err != nil || r.Token != tc.token {
				t.Fatalf("the resource after the acquire: token %d, %v; want %d", r.Token, err, tc.token)
			}
		})
	}
}
