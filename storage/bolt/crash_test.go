package bolt

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

const crashChildEnv = "FENCEGW_BOLT_CRASH_CHILD"

// crashReport is what the child tells the parent before it is killed.
type crashReport struct {
	Held     tokens.Lease // live for an hour
	Recent   tokens.Lease // expires at once, within the crash drain
	Released tokens.Lease // released just before the crash: a write may still be in flight
	Cycled   int64        // the last token of a resource granted and released many times
}

// TestCrashChild is the child half of TestCrash: it grants, reports and
// waits to be killed. It does nothing unless run by TestCrash.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		t.Skip("only run as TestCrash's child process")
	}
	s, err := Open(path, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	grant := func(resource string, ttl time.Duration) tokens.Lease {
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: "child", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	var rep crashReport
	for range 5 {
		l := grant("cycled", time.Hour)
		if _, err := s.Release(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
		rep.Cycled = l.Token
	}
	rep.Released = grant("released", time.Hour)
	if rep.Released, err = s.Release(ctx, rep.Released.ID); err != nil {
		t.Fatal(err)
	}
	rep.Held = grant("held", time.Hour)
	rep.Recent = grant("recent", 100*time.Millisecond)
	b, _ := json.Marshal(rep)
	// Every grant above returned, so it was committed and synced; the
	// parent kills us now, with the store open and no shutdown marker.
	os.Stdout.WriteString("READY " + string(b) + "\n")
	time.Sleep(time.Minute)
	t.Fatal("not killed")
}

// TestCrash runs a child process that grants leases and is then killed with
// SIGKILL, and checks what the next Open finds: every granted token is
// still there (none is issued twice), the live lease survives, and resources
// whose writes may still have been in flight are drained.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	path := filepath.Join(t.TempDir(), "data", "fencegw.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var rep crashReport
	lines := bufio.NewScanner(out)
	ready := make(chan error, 1)
	go func() {
		for lines.Scan() {
			if line, ok := strings.CutPrefix(lines.Text(), "READY "); ok {
				ready <- json.Unmarshal([]byte(line), &rep)
				return
			}
		}
		ready <- errors.New("child exited without reporting")
	}()
	select {
	case err := <-ready:
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("child did not report")
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no Close, no marker
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("child exited cleanly; want it killed")
	}
	// Let "recent" expire: it must be drained anyway.
	time.Sleep(time.Until(rep.Recent.ExpiresAt) + 10*time.Millisecond)

	// Long enough that the checks below, slow on a loaded machine (-race,
	// fsyncs), all run inside the drain.
	const crashDrain = 3 * time.Second
	opened := time.Now()
	s := openAt(t, path, Options{CrashDrain: crashDrain})
	ctx := t.Context()
	newGrant := func(resource string) (tokens.Lease, error) {
		return s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: "parent", TTL: time.Minute})
	}

	held, err := s.Resource(ctx, "held")
	if err != nil || held.Token != rep.Held.Token || held.Lease == nil || held.Lease.ID != rep.Held.ID ||
		!held.Lease.ExpiresAt.Equal(rep.Held.ExpiresAt) {
		t.Fatalf("after the crash held = %+v, %v; want the child's lease %+v", held, err, rep.Held)
	}
	if !held.DrainUntil.After(opened) || held.DrainUntil.After(time.Now().Add(crashDrain)) {
		t.Fatalf("held.DrainUntil = %v, want about open+%v", held.DrainUntil, crashDrain)
	}
	if _, err := newGrant("held"); !errors.Is(err, tokens.ErrLeaseHeld) {
		t.Fatalf("Grant(held) after the crash: %v, want ErrLeaseHeld", err)
	}
	if _, err := s.Renew(ctx, rep.Held.ID, 0); err != nil {
		t.Fatalf("Renew of the surviving lease: %v", err)
	}

	_, err = newGrant("recent")
	if f := tokens.ErrorOf(err); !errors.Is(err, tokens.ErrFenceBusy) || f.RetryAfter <= 0 || f.RetryAfter > crashDrain {
		t.Fatalf("Grant(recent) after the crash: %v, want ErrFenceBusy with RetryAfter in (0, %v]", err, crashDrain)
	}

	// A release does not wait for the writes in flight under the lease:
	// one sent just before the release may still land.
	for _, res := range []string{"released", "cycled"} {
		if _, err := newGrant(res); !errors.Is(err, tokens.ErrFenceBusy) {
			t.Fatalf("Grant(%s) after the crash: %v, want ErrFenceBusy (released just before the crash)", res, err)
		}
	}

	// The drain ends, and the next token follows the child's.
	time.Sleep(time.Until(held.DrainUntil) + 10*time.Millisecond)
	if l, err := newGrant("recent"); err != nil || l.Token != rep.Recent.Token+1 {
		t.Fatalf("Grant(recent) after the drain = %+v, %v; want token %d", l, err, rep.Recent.Token+1)
	}
	if l, err := newGrant("released"); err != nil || l.Token != rep.Released.Token+1 {
		t.Fatalf("Grant(released) after the drain = %+v, %v; want token %d", l, err, rep.Released.Token+1)
	}
	if l, err := newGrant("cycled"); err != nil || l.Token != rep.Cycled+1 {
		t.Fatalf("Grant(cycled) after the drain = %+v, %v; want token %d (none reissued)", l, err, rep.Cycled+1)
	}

	// A clean restart drains nothing.
	s = reopen(t, s, Options{CrashDrain: time.Hour})
	if r, err := s.Resource(ctx, "held"); err != nil || !r.DrainUntil.Equal(held.DrainUntil) {
		t.Fatalf("after a clean restart DrainUntil = %v, %v; want unchanged %v", r.DrainUntil, err, held.DrainUntil)
	}
}

// A Close while Options.InFlight reports writes leaves the file unmarked:
// the next Open drains as after a crash. With none in flight it is clean.
func TestCloseWithWritesInFlightIsUnclean(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegw.db")
	inFlight := 1
	s := openAt(t, path, Options{InFlight: func() int { return inFlight }})
	ctx := t.Context()
	if _, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "h", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	const crashDrain = time.Minute
	opened := time.Now()
	s = reopen(t, s, Options{CrashDrain: crashDrain, InFlight: func() int { return inFlight }})
	r, err := s.Resource(ctx, "r")
	if err != nil || !r.DrainUntil.After(opened) {
		t.Fatalf("after a close with a write in flight DrainUntil = %v, %v; want about open+%v", r.DrainUntil, err, crashDrain)
	}
	inFlight = 0
	s = reopen(t, s, Options{CrashDrain: time.Hour})
	if r2, err := s.Resource(ctx, "r"); err != nil || !r2.DrainUntil.Equal(r.DrainUntil) {
		t.Fatalf("after a close with nothing in flight DrainUntil = %v, %v; want unchanged %v", r2.DrainUntil, err, r.DrainUntil)
	}
}

// After a crash, only leases that ended within twice the crash drain (a
// write's forward timeout and its drain) are drained: one released or
// expired long before is granted at once, one released recently is not.
func TestCrashDrainHorizon(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegw.db")
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now := t0
	clock := func() time.Time { return now }
	const crashDrain = 10 * time.Second
	s := openAt(t, path, Options{Now: clock, CrashDrain: crashDrain})
	ctx := t.Context()
	grant := func(resource string, ttl time.Duration) tokens.Lease {
		t.Helper()
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: "h", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	release := func(l tokens.Lease) {
		t.Helper()
		if _, err := s.Release(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	release(grant("released-long-ago", time.Hour))
	grant("expired-long-ago", time.Second)
	now = t0.Add(100 * time.Second)
	release(grant("released-recently", time.Hour))
	grant("expired-recently", time.Second)
	now = now.Add(15 * time.Second) // past one crash drain, within two

	// A crash: the file is closed without the clean-shutdown marker.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyClean) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s = openAt(t, path, Options{Now: clock, CrashDrain: crashDrain})
	for res, drained := range map[string]bool{"released-long-ago": false, "expired-long-ago": false, "released-recently": true, "expired-recently": true} {
		r, err := s.Resource(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.DrainUntil.After(now); got != drained {
			t.Errorf("%s: drained after the crash = %v (until %v), want %v", res, got, r.DrainUntil, drained)
		}
	}
}
