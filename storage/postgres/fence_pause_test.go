package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
// SessionKilled rules). A proof of a write in flight waits for the slow
// check, up to its deadline and no longer.
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
		v, err := fence.Hold(ctx, lease.ID)
		if err != nil {
			return err
		}
		if v.Refusal != nil {
			return v.Refusal
		}
		v.Held.Release()
		return nil
	}
	if err := hold(5 * time.Second); err != nil {
		t.Fatalf("first write: %v", err)
	}
	// A write admitted before the pause, whose bytes are to be sent while
	// the session answers late: its proof waits for the session's next
	// answer instead of cutting the write short.
	v, err := fence.Hold(ctx, lease.ID)
	if err != nil || v.Refusal != nil {
		t.Fatal(err, v.Refusal)
	}
	inflight := v.Held
	defer inflight.Release()
	acquired := fence.Stats().Acquired.Load()

	pids := fence.SessionPIDs()
	signal := func(sig syscall.Signal) error { return signalBackends(pids, sig) }
	if err := signal(syscall.SIGSTOP); err != nil {
		// A server on another host, or one this user may not signal: the
		// rule goes unchecked, which CI must not accept.
		if os.Getenv("CI") == "true" {
			t.Fatalf("cannot pause the lock sessions' backends %v, required under CI: %v", pids, err)
		}
		t.Skipf("cannot pause the lock sessions' backends %v from here: %v", pids, err)
	}
	pausedAt := time.Now()
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

	// Admission stops once the session has gone unconfirmed: wait for that,
	// with a deadline far beyond the three SessionChecks it takes.
	stopped := time.Now().Add(30 * check)
	for hold(check) == nil {
		if time.Now().After(stopped) {
			t.Fatal("writes were still admitted on a session not confirmed for 30 SessionChecks")
		}
	}
	// A proof that must not wait answers at once; one whose deadline
	// passes before the session's check settles gives up at the deadline
	// (the gateway's forward timeout): neither sends on an unconfirmed
	// session. The backends stay paused until both have answered.
	if err := inflight.Check(time.Time{}); !errors.Is(err, tokens.ErrFenceLost) {
		t.Errorf("a proof without a deadline on an unconfirmed session: %v, want ErrFenceLost at once", err)
	}
	if err := inflight.Check(time.Now().Add(check)); !errors.Is(err, tokens.ErrFenceLost) {
		t.Errorf("a proof whose deadline passed while the session was unconfirmed: %v, want ErrFenceLost", err)
	}
	proof := make(chan error, 1)
	go func() { proof <- inflight.Check(time.Now().Add(time.Minute)) }()
	// The pause lasts five SessionChecks in all (the old ping timeout was
	// one): the length of the stall is this test's input, not a wait.
	time.Sleep(time.Until(pausedAt.Add(5 * check)))
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

// signalBackends sends sig to PostgreSQL's backend processes. It tries
// directly first (root, or the server's own user), then as the postgres OS
// user through runuser or sudo, for a developer running the tests as
// themselves against the distribution's server.
func signalBackends(pids []uint32, sig syscall.Signal) error {
	var direct error
	for _, pid := range pids {
		if err := syscall.Kill(int(pid), sig); err != nil {
			direct = err
			break
		}
	}
	if direct == nil {
		return nil
	}
	args := []string{"kill", "-" + strconv.Itoa(int(sig))}
	for _, pid := range pids {
		args = append(args, strconv.Itoa(int(pid)))
	}
	var errs []error
	for _, via := range [][]string{{"runuser", "-u", "postgres", "--"}, {"sudo", "-n", "-u", "postgres"}} {
		out, err := exec.Command(via[0], append(via[1:], args...)...).CombinedOutput()
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w: %s", via[0], err, strings.TrimSpace(string(out))))
	}
	return fmt.Errorf("signal %v: %w (and as postgres: %w)", sig, direct, errors.Join(errs...))
}
