package postgres_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// A lock session whose database answers late (a CPU-starved host, a busy
// server: here its backend is paused for a few SessionChecks) stops
// admission, and that is all: once the answer comes the fences it held are
// still held, and writes are admitted on them again without a drain. It
// used to be destroyed after SessionCheck, dropping every fence on it, so
// each of their resources drained for the orphan period before its next
// grant. A dead session is still dropped at once (the fence suite's
// SessionKilled rules).
func TestSlowSessionKeepsItsFences(t *testing.T) {
	pgtest.Require(t)
	const check = 200 * time.Millisecond
	r := pgtest.FenceReplicas(t, 1, storagetest.FenceOptions{SessionCheck: check, DrainPeriod: time.Second, Idle: time.Minute}, nil)[0]
	fence := r.Fencer.(*postgres.Fence)
	ctx := context.Background()
	lease, err := r.Store.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "slow", Holder: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	hold := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, _, held, err := fence.Hold(ctx, lease.ID)
		if err == nil {
			held.Release()
		}
		return err
	}
	if err := hold(5 * time.Second); err != nil {
		t.Fatalf("first write: %v", err)
	}
	// A write admitted before the pause, whose bytes are to be sent while
	// the session answers late: its proof waits for the session's next
	// answer instead of cutting the write short.
	_, _, inflight, err := fence.Hold(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer inflight.Release()
	acquired := fence.Stats().Acquired.Load()

	pids := fence.SessionPIDs()
	signal := func(sig syscall.Signal) error {
		for _, pid := range pids {
			if err := syscall.Kill(int(pid), sig); err != nil {
				return err
			}
		}
		return nil
	}
	if err := signal(syscall.SIGSTOP); err != nil {
		// A server on another host, or one this user may not signal.
		t.Skipf("cannot pause the lock sessions' backends %v from here: %v", pids, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := signal(syscall.SIGCONT); err != nil {
				t.Errorf("resume backends %v: %v", pids, err)
			}
		}
	}
	defer resume()

	time.Sleep(3 * check)
	if err := hold(check); err == nil {
		t.Fatal("a write was admitted on a session not confirmed for three SessionChecks")
	}
	proof := make(chan error, 1)
	go func() { proof <- inflight.Check() }()
	time.Sleep(2 * check) // five SessionChecks in all: the old ping timeout was one
	resume()
	if err := <-proof; err != nil {
		t.Errorf("the proof of a write in flight on a slow, live session: %v, want it to wait for the answer", err)
	}

	deadline := time.Now().Add(5 * time.Second)
	for hold(check) != nil {
		if time.Now().After(deadline) {
			t.Fatal("no write admitted within 5 s of the session answering again")
		}
	}
	if lost := fence.Stats().Lost.Load(); lost != 0 {
		t.Errorf("%d fences dropped: a slow session was destroyed", lost)
	}
	if got := fence.Stats().Acquired.Load(); got != acquired {
		t.Errorf("the fence was taken anew (%d acquisitions, %d before the pause)", got, acquired)
	}
}
