package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// previousRelease is the commit of the release before this one: a rolling
// upgrade runs replicas of both on one database (FENCEGW_PREVIOUS_COMMIT
// overrides it once there are tags).
const previousRelease = "6b27524"

// buildPrevious builds fencegw as it was at the previous release, from
// this repository's history (git archive, so that no worktree is made).
func buildPrevious(t *testing.T) string {
	t.Helper()
	rev := os.Getenv("FENCEGW_PREVIOUS_COMMIT")
	if rev == "" {
		rev = previousRelease
	}
	requireBinary(t, "git")
	requireBinary(t, "tar")
	dir := t.TempDir()
	requireBinary(t, "bash")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	extract := exec.Command("bash", "-o", "pipefail", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "bash", root, rev, dir)
	if out, err := extract.CombinedOutput(); err != nil {
		missing(t, "git archive "+rev+" of "+root+": "+err.Error()+" "+string(out))
	}
	bin := filepath.Join(dir, "fencegw-previous")
	build := exec.Command("go", "build", "-o", bin, "./cmd/fencegw")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the previous release (%s): %v\n%s", rev, err, out)
	}
	return bin
}

// A rolling upgrade on one PostgreSQL: a replica of this release starts
// first and migrates the schema, a replica of the previous release runs
// beside it on the migrated schema under load, then is replaced by one of
// this release. No token is granted twice or goes back, no stale write
// reaches the upstream, and neither version answers what the other
// would not.
func TestMixedVersionsRollingUpgrade(t *testing.T) {
	old := buildPrevious(t)
	pg := startPostgres(t)
	up := newUpstream(t)
	args := []string{"--postgres", pg.URL(), "--upstream", "svc=" + up.URL, "--log-level", "warn",
		"--forward-timeout", "5s", "--drain-period", "1s", "--grant-wait", "2s"}
	cur := startProc(t, args...)
	prev := startBinary(t, old, args...)
	bases := []string{cur.url(), prev.url()}

	c := &churn{ledger: newTokenLedger(), outcomes: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	c.run(ctx, &wg, bases, 6, 4, "mixed")
	time.Sleep(3 * time.Second)
	cancel()
	wg.Wait()
	if c.count("before write 200") == 0 {
		t.Fatal("void run: no write went through with both versions up")
	}

	// The previous release's replica is replaced by one of this release.
	if err := prev.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-prev.exited
	if prev.err != nil {
		t.Errorf("the previous release's replica exited with %v:\n%s", prev.err, prev.output())
	}
	next := startProc(t, args...)
	c.afterFault.Store(true)
	bases = []string{cur.url(), next.url()}
	ctx, cancel = context.WithCancel(context.Background())
	c.run(ctx, &wg, bases, 6, 4, "mixed")
	time.Sleep(2 * time.Second)
	cancel()
	wg.Wait()
	c.log(t)
	for k, n := range c.outcomes {
		if k != "before grant 201" && k != "before write 200" && k != "after grant 201" && k != "after write 200" &&
			k != "before grant 409 lease_held" && k != "after grant 409 lease_held" && k != "before write 409 stale_token" &&
			k != "after write 409 stale_token" && k != "before write 409 lease_released" && k != "after write 409 lease_released" {
			t.Errorf("%d × %q across versions", n, k)
		}
	}
	c.ledger.check(t, time.Now(), time.Now(), bases)
	up.checkOrder(t)
}
