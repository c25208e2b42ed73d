package main

// Replica faults: a replica killed (kill -9) while one of its writes is held
// at the upstream, and a replica frozen (SIGSTOP) with a write in flight,
// run with the recording upstream, the workers and the token ledger of
// faults_test.go.

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A replica is killed (kill -9) while one of its writes is held at the
// upstream. Its database sessions die with it, and with them its shared
// advisory lock on the resource.
//
// Guaranteed, and checked: the other replicas keep serving throughout; no
// token is reissued (tokens granted by the killed replica stay below every
// later grant); the killed replica's holder is fenced (its lease, retried
// through a surviving replica, gets 409 once a newer grant exists); no
// write of an older token is admitted after a newer grant.
//
// Guaranteed since the fence (guarantee 7): the write that was
// at the upstream when the replica died may still land, so the next grant
// of its resource waits out a drain period (the dead replica's presence row
// says it had the fence); resources it never fenced are not held up. Here
// the kill also breaks the replica's connection to the upstream; whether
// the upstream then applies or drops that request is up to the upstream.
// The test logs what happened to it.
func TestFaultReplicaKilledMidWrite(t *testing.T) {
	pg := startPostgres(t)
	up := newUpstream(t)
	ps := startReplicas(t, 3, "--postgres", pg.URL(), "--upstream", "svc="+up.URL,
		"--forward-timeout", "10s", "--drain-period", "2s", "--grant-wait", "3s")
	bases := []string{ps[0].url(), ps[1].url(), ps[2].url()}

	// Grants storm through the victim; the survivors serve other resources.
	storm := &churn{ledger: newTokenLedger(), outcomes: map[string]int{}}
	others := &churn{ledger: newTokenLedger(), outcomes: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stormWG, othersWG sync.WaitGroup
	storm.run(ctx, &stormWG, bases[:1], 4, 4, "storm")
	othersCtx, othersCancel := context.WithCancel(context.Background())
	defer othersCancel()
	others.run(othersCtx, &othersWG, bases[1:], 4, 2, "other")

	a, ans := grant(bases[0], "victim", "A", time.Second, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("A: %v", ans)
	}
	held := make(chan answer, 1)
	go func() { held <- fencedWrite(bases[0], a.LeaseID, "/hold/victim", "A held") }()
	select {
	case <-up.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("A's write did not reach the upstream")
	}
	storm.waitWrites(t, "before", 10) // the storm runs on the victim

	killAt := time.Now()
	if err := ps[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-ps[0].exited
	others.afterFault.Store(true)
	cancel() // the storm's replica is gone
	stormWG.Wait()
	if r := <-held; r.err == nil {
		t.Errorf("A's held write answered %v although its replica was killed", r)
	}
	select {
	case <-up.cancelled:
		t.Logf("the upstream saw the killed replica's connection break while holding A's write (it had the whole request: applying it or not is the upstream's call)")
	case <-time.After(2 * time.Second):
		t.Logf("the upstream did not notice the killed replica's connection break within 2 s: A's write is still in flight there")
	}

	// A new grant waits for A's lease to expire (1 s TTL) and then for the
	// drain that the dead replica's fence starts (--drain-period 2s plus the
	// 1 s session check).
	b, ans := grant(bases[1], "victim", "B", time.Minute, 8*time.Second)
	if ans.code != http.StatusCreated {
		t.Fatalf("B after the kill: %v", ans)
	}
	grantedAfter := time.Since(killAt)
	t.Logf("B granted %v after the kill (A's TTL 1 s, then the drain)", grantedAfter.Round(time.Millisecond))
	if grantedAfter < 2*time.Second {
		t.Errorf("B was granted %v after the replica holding A's write died; the drain period is 2 s", grantedAfter.Round(time.Millisecond))
	}
	if b.Token <= a.Token {
		t.Fatalf("guarantee 3 violated: B got token %d after A's %d", b.Token, a.Token)
	}
	// The killed replica's holder retries through a survivor: fenced.
	want409(t, "A through a surviving replica", fencedWrite(bases[2], a.LeaseID, "/victim", "A retry"), "stale_token")
	if up.received("A retry") {
		t.Error("guarantee 1 violated: A's retry reached the upstream")
	}
	if w := fencedWrite(bases[2], b.LeaseID, "/victim", "B"); w.code != http.StatusOK {
		t.Errorf("B's write: %v", w)
	}

	others.waitWrites(t, "after", 10) // the survivors go on serving
	othersCancel()
	othersWG.Wait()
	storm.log(t)
	others.log(t)
	if storm.count("before grant 201") == 0 {
		t.Fatal("void run: the storm on the killed replica granted nothing")
	}
	// The survivors kept serving: writes went through after the kill, and
	// nothing they answered was a 5xx.
	if others.count("after write 200") == 0 {
		t.Error("the surviving replicas served no write after the kill")
	}
	others.mu.Lock()
	for k, n := range others.outcomes {
		if strings.Contains(k, " 5") || strings.Contains(k, " err") {
			t.Errorf("surviving replicas: %d × %q", n, k)
		}
	}
	others.mu.Unlock()
	storm.ledger.check(t, killAt, killAt, bases[1:])
	others.ledger.check(t, killAt, killAt, bases[1:])
	up.checkOrder(t)
}

// A replica is frozen (SIGSTOP) while a write of the current lease is in
// flight through it, so it holds the resource's shared lock — and its
// database session stays alive, so the lock holds. A grant on another
// replica must wait for that write: it answers 503 fence_busy after
// --grant-wait (with Retry-After) or, waiting longer, goes through only
// after the replica resumes (SIGCONT) and the write completes. It never
// overtakes the write.
func TestFaultReplicaStopped(t *testing.T) {
	pg := startPostgres(t)
	up := newUpstream(t)
	ps := startReplicas(t, 2, "--postgres", pg.URL(), "--upstream", "svc="+up.URL,
		"--forward-timeout", "20s", "--drain-period", "2s", "--grant-wait", "1s")
	bases := []string{ps[0].url(), ps[1].url()}

	a, ans := grant(bases[0], "frozen", "A", 500*time.Millisecond, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("A: %v", ans)
	}
	held := make(chan answer, 1)
	go func() { held <- fencedWrite(bases[0], a.LeaseID, "/hold/frozen", "A in flight") }()
	select {
	case <-up.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("A's write did not reach the upstream")
	}
	if err := ps[0].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps[0].cmd.Process.Signal(syscall.SIGCONT) })
	waitExpired(t, bases[1], a.LeaseID) // A's lease expires meanwhile

	// The lease is free, the lock is not: fence_busy after the grant wait.
	_, busy := grant(bases[1], "frozen", "B", time.Minute, 0)
	want503(t, "grant while the write is in flight on the frozen replica", busy, "fence_busy")
	if busy.took < 900*time.Millisecond {
		t.Errorf("fence_busy after %v, before --grant-wait (1 s)", busy.took)
	}

	type result struct {
		l  lease
		a  answer
		at time.Time
	}
	granted := make(chan result, 1)
	go func() {
		l, a := grant(bases[1], "frozen", "B", time.Minute, 20*time.Second)
		granted <- result{l, a, time.Now()}
	}()
	select {
	case r := <-granted:
		t.Fatalf("grant overtook the in-flight write while its replica was stopped: %v", r.a)
	case <-time.After(time.Second):
	}
	if err := ps[0].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Resumed, but the write is still held at the upstream: still no grant.
	select {
	case r := <-granted:
		t.Fatalf("grant overtook the in-flight write after its replica resumed: %v", r.a)
	case <-time.After(700 * time.Millisecond):
	}
	releasedAt := time.Now()
	up.Release()
	if r := <-held; r.code != http.StatusOK {
		t.Errorf("A's in-flight write: %v, want 200", r)
	}
	r := <-granted
	if r.a.code != http.StatusCreated {
		t.Fatalf("B's waiting grant: %v", r.a)
	}
	if !r.at.After(releasedAt) {
		t.Error("B's grant returned before the in-flight write completed")
	}
	if r.l.Token <= a.Token {
		t.Fatalf("guarantee 3 violated: B got token %d after A's %d", r.l.Token, a.Token)
	}
	t.Logf("B granted %v after the in-flight write was let go", r.at.Sub(releasedAt).Round(time.Millisecond))
	want409(t, "A after B's grant", fencedWrite(bases[0], a.LeaseID, "/frozen", "A stale"), "stale_token")
	if w := fencedWrite(bases[0], r.l.LeaseID, "/frozen", "B"); w.code != http.StatusOK {
		t.Errorf("B's write through the resumed replica: %v", w)
	}
	if up.received("A stale") {
		t.Error("A's stale write reached the upstream")
	}
	up.checkOrder(t)
}
