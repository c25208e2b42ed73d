package main

// Waiting acquires whose clients leave while their store is paused: the
// acquires' store calls hang (a SIGSTOPped PostgreSQL cluster or Redis
// server, as a stalled VM or a long GC of the store), their clients close
// or half-close, and each replica must count every one abandoned (the
// client went; the store did not fail), then, with the store back, grant
// nothing to them: the holder's release frees the resource, and the next
// grant gets the holder's token + 1.

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAbandonedAcquiresWhileTheStoreIsPaused(t *testing.T) {
	for _, mode := range []string{"postgres", "redis"} {
		t.Run(mode, func(t *testing.T) {
			up := newUpstream(t) // holds writes to /hold/ until Release (faults_test.go)
			args, pause := pausableStore(t, mode)
			args = append(args, "--upstream", "svc="+up.URL, "--grant-wait", "30s", "--forward-timeout", "1s")
			ps := startReplicas(t, 2, args...)
			res := "abandoned-paused-store"
			holder, ans := grant(ps[1].url(), res, "holder", time.Minute, 0)
			if ans.code != http.StatusCreated {
				t.Fatalf("the holder's grant: %v", ans)
			}
			body := fmt.Sprintf(`{"resource":%q,"holder":"waiter","ttl_ms":60000,"wait_ms":20000}`, res)
			testAbandonedAcquires(t, ps, false, pause, res, body, holder.Token, func() {
				if a := release(ps[1].url(), holder.LeaseID); a.code != http.StatusNoContent {
					t.Fatalf("the holder's release, the store back: %v", a)
				}
			})
		})
	}
}

// pausableStore starts a private PostgreSQL cluster and, in the redis
// mode, a private Redis: it returns the gateway's arguments for them and a
// pause of the store that mode reads a lease from (the cluster, or Redis),
// which returns the store's resume. The drain period is short: a cluster
// just started closes a resource that had a lease to grants for that long
// (the restart drain), and the tests grant again at once.
func pausableStore(t *testing.T, mode string) (args []string, pause func() (resume func())) {
	t.Helper()
	pg := startPostgres(t)
	args = []string{"--postgres", pg.URL(), "--drain-period", "1s"}
	pause = func() func() { return pg.pause(t) }
	if mode == "redis" {
		r := startRedis(t)
		args = append(args, "--redis", r.URL())
		pause = func() func() { return r.pause(t) }
	}
	return args, pause
}

// pause stops (SIGSTOP) the cluster's postmaster and every backend; what it
// returns resumes them (SIGCONT), as does the test's end.
func (c *pgCluster) pause(t *testing.T) (resume func()) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.dir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	out, _ := exec.Command("pgrep", "-P", strconv.Itoa(pid)).Output() // no children: none to stop
	pids := []int{pid}
	for _, f := range strings.Fields(string(out)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	signal := func(sig syscall.Signal) {
		for _, p := range pids {
			_ = syscall.Kill(p, sig)
		}
	}
	signal(syscall.SIGSTOP)
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

// pause stops (SIGSTOP) the server; what it returns resumes it, as does
// the test's end.
func (r *redisServer) pause(t *testing.T) (resume func()) {
	t.Helper()
	r.mu.Lock()
	p := r.cmd.Process
	r.mu.Unlock()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			_ = p.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

// TestAbandonedWriteWhileTheStoreIsPaused: a fenced write that Go's server
// serves (its head is over the loop's 4 KiB), the first of its lease on
// its replica, asks its store while the store is stopped (SIGSTOP): the
// PostgreSQL cluster, for its fence and its lease, or Redis, for its
// lease's claim. Its client leaves meanwhile. The write is counted
// abandoned, not as the store's failure; nothing reaches the upstream;
// and with the store back a write of the same lease goes through.
func TestAbandonedWriteWhileTheStoreIsPaused(t *testing.T) {
	for _, mode := range []string{"postgres", "redis"} {
		t.Run(mode, func(t *testing.T) {
			p, up, holder, pause := pausedStoreHolder(t, mode, "1s")
			before := writeOutcomes(t, p.url())
			resume := pause()

			abandonWrite(t, p, holder.LeaseID, before, "its store was stopped")
			resume()
			if a := fencedWrite(p.url(), holder.LeaseID, "/after", "after"); a.code != http.StatusOK {
				t.Errorf("a write of the lease, the store back: %v; want the upstream's 200", a)
			}
			if n := up.count(); n != 1 {
				t.Errorf("%d writes reached the upstream; want 1, the one after the store came back", n)
			}
		})
	}
}

// TestAbandonedWriteBehindAReleaseWhileTheStoreIsPaused: a fenced write
// that Go's server serves waits for its fence behind the holder's release,
// which waits for a write of the lease held at the upstream; the store
// (the PostgreSQL cluster, or Redis) is stopped (SIGSTOP) and the waiting
// write's client leaves. The write is counted abandoned; with the store
// back the held write is answered, the release goes through, and only the
// held write reached the upstream.
func TestAbandonedWriteBehindAReleaseWhileTheStoreIsPaused(t *testing.T) {
	for _, mode := range []string{"postgres", "redis"} {
		t.Run(mode, func(t *testing.T) {
			p, up, holder, pause := pausedStoreHolder(t, mode, "30s")
			written := holdWrite(t, p.url(), up, holder.LeaseID)
			released := make(chan answer, 1)
			go func() { released <- release(p.url(), holder.LeaseID) }()
			time.Sleep(300 * time.Millisecond) // the release waits for the write in flight
			before := writeOutcomes(t, p.url())
			resume := pause()
			abandonWrite(t, p, holder.LeaseID, before, "it waited for its fence and its store was stopped")
			resume()
			up.Release()
			if a := <-written; a.code != http.StatusOK {
				t.Errorf("the held write: %v; want the upstream's 200", a)
			}
			if a := <-released; a.code != http.StatusNoContent {
				t.Errorf("the release the write waited behind: %v; want 204", a)
			}
			if n := up.count(); n != 1 {
				t.Errorf("%d writes reached the upstream; want 1, the held one", n)
			}
			if next, a := grant(p.url(), "abandoned-write-paused", "next", time.Minute, 0); a.code != http.StatusCreated || next.Token != holder.Token+1 {
				t.Errorf("the next grant: %v (token %d); want 201 and token %d", a, next.Token, holder.Token+1)
			}
		})
	}
}

// pausedStoreHolder starts one replica on a pausableStore of mode, its
// upstream (which holds writes to /hold/ until Release, faults_test.go)
// and its forward timeout, and grants a lease of a resource of its own:
// the start of the tests of a write whose store is paused.
func pausedStoreHolder(t *testing.T, mode, forwardTimeout string) (p *proc, up *recUpstream, holder lease, pause func() (resume func())) {
	t.Helper()
	up = newUpstream(t)
	args, pause := pausableStore(t, mode)
	args = append(args, "--upstream", "svc="+up.URL, "--forward-timeout", forwardTimeout)
	p = startReplicas(t, 1, args...)[0]
	holder, ans := grant(p.url(), "abandoned-write-paused", "holder", time.Minute, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("the holder's grant: %v", ans)
	}
	return p, up, holder, pause
}
