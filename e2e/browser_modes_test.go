package e2e

// The dashboard in the PostgreSQL and Redis modes: real `fencegw serve`
// replicas sharing one database, the page open on one replica while the
// stale write goes through another.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// gatewayBinary builds cmd/fencegw once per test binary.
func gatewayBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fencegw-e2e-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "fencegw")
		if out, err := exec.Command("go", "build", "-o", binPath, "../cmd/fencegw").CombinedOutput(); err != nil {
			binErr = fmt.Errorf("build fencegw: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// freshDatabase creates a database of its own for a test (the gateway has
// no schema flag, and its NOTIFY channel is per schema) and drops it after.
func freshDatabase(t *testing.T) string {
	t.Helper()
	pgtest.Require(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "fencegw_browser_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pgtest.URL())
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

var servingOn = regexp.MustCompile(`serving on (http://\S+)`)

// serveReplica runs `fencegw serve` with args and returns its base URL; it
// is killed when the test ends.
func serveReplica(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(gatewayBinary(t), append([]string{"serve", "--listen", "127.0.0.1:0", "--data", t.TempDir()}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logMu sync.Mutex
	var log strings.Builder
	cmd.Stderr = &lockedWriter{mu: &logMu, b: &log}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			logMu.Lock()
			t.Logf("replica %v log:\n%s", args, log.String())
			logMu.Unlock()
		}
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := servingOn.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case u := <-found:
		return u
	case <-exited:
		t.Fatalf("fencegw serve %v exited at start", args)
	case <-time.After(30 * time.Second):
		t.Fatalf("fencegw serve %v did not start", args)
	}
	return ""
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func TestBrowserAcrossReplicas(t *testing.T) {
	for _, mode := range []string{"postgres", "postgres-redis"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{"--postgres", freshDatabase(t)}
			if mode == "postgres-redis" {
				requireRedis(t).Close()
				redisURL := os.Getenv("FENCEGW_TEST_REDIS")
				if redisURL == "" {
					redisURL = "redis://127.0.0.1:6379/0"
				}
				args = append(args, "--redis", redisURL)
			}
			ctx, dialogs := browser(t)
			up := newUpstream(t)
			args = append(args, "--upstream", "statements="+up.URL)
			a, b := serveReplica(t, args...), serveReplica(t, args...)
			// Redis keys are not per test: a resource name of this run's own.
			var r [4]byte
			_, _ = rand.Read(r[:])
			res := "stmt:acct:" + hex.EncodeToString(r[:])

			w3 := acquire(t, b, res, "worker-3", 400*time.Millisecond)
			if ans := write(t, b, "statements", "/lines", w3, `{"line":1}`); ans.Status != 200 {
				t.Fatalf("worker-3 write: %d %s", ans.Status, ans.Body)
			}
			waitLeaseState(t, b, w3.LeaseID, "expired")
			// With Redis, the lease reads as expired once its claim is gone,
			// which may be before the expiry the ledger recorded by as long as
			// the ledger took to record the grant (docs/design.md, Known
			// differences): the timeline below counts worker-3's lease as
			// expired only if worker-5's grant came after that expiry (this
			// machine's clock is the database's).
			time.Sleep(time.Until(w3.ExpiresAt.Add(10 * time.Millisecond)))
			// worker-5's acquire waits, should the claim still be there.
			got := do(t, "POST", a+"/v1/leases", map[string]any{"resource": res, "holder": "worker-5",
				"ttl_ms": time.Hour.Milliseconds(), "wait_ms": (10 * time.Second).Milliseconds()})
			if got.Status != 201 {
				t.Fatalf("worker-5 acquire: %d %s", got.Status, got.Body)
			}
			w5 := acquireDecode(t, got)
			if ans := write(t, a, "statements", "/lines", w5, `{"line":2}`); ans.Status != 200 {
				t.Fatalf("worker-5 write: %d %s", ans.Status, ans.Body)
			}

			within(t, ctx, 15*time.Second, "open overview on replica A", chromedp.Navigate(a+"/ui/?range=15m&resource="+url.QueryEscape(res)))
			waitLive(t, ctx)
			// worker-3 wakes up and writes through replica B; replica A's page shows it.
			wantProblem(t, write(t, b, "statements", "/lines", w3, `{"line":99}`), 409, "stale_token")
			refused := time.Now()
			took := feedRowWith(t, ctx, "worker-3")
			t.Logf("%s: the stale write through replica B appeared on replica A's live feed %v after its 409", mode, took.Round(time.Millisecond))
			row := eval[string](t, ctx, `document.querySelector('#feed tbody tr[data-id]').textContent`)
			for _, want := range []string{res, "POST statements/lines", "1 vs 2", "worker-3", "stale_token"} {
				if !strings.Contains(row, want) {
					t.Errorf("feed row %q lacks %q", row, want)
				}
			}
			// The counts are the store's, so replica A counts B's refusal, and
			// its cards, chart and leases follow its feed.
			took = waitAgree(t, ctx, refused, agreeWithin, agreement(1, "worker-5/2"))
			t.Logf("%s: replica A's cards, chart, leases and feed agreed %v after the 409 through replica B", mode, took.Round(time.Millisecond))
			screenshot(t, ctx, "overview", "")

			// Writes accepted under each token are counted by every replica
			// and stored once a second: replica A's page counts worker-3's
			// write through B.
			var steps []string
			deadline := time.Now().Add(10 * time.Second)
			for {
				within(t, ctx, 15*time.Second, "open resource on replica A", chromedp.Navigate(a+"/ui/resources/"+url.PathEscape(res)))
				steps = eval[[]string](t, ctx, `Array.from(document.querySelectorAll('#timeline li')).map(li => li.textContent.replace(/\s+/g, ' ').trim())`)
				if slices.ContainsFunc(steps, func(s string) bool {
					return strings.Contains(s, "worker-3 acquired token 1") && strings.Contains(s, "1 write accepted under it")
				}) &&
					slices.ContainsFunc(steps, func(s string) bool {
						return strings.Contains(s, "worker-5 acquired token 2") && strings.Contains(s, "1 write accepted under it")
					}) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("replica A's timeline does not count each token's write:\n%s", strings.Join(steps, "\n"))
				}
				time.Sleep(200 * time.Millisecond)
			}
			at := 0
			for _, w := range []string{
				"worker-3 wrote POST statements/lines with token 1: rejected stale_token, current token 2",
				"worker-5 acquired token 2",
				"token 1 of worker-3 expired",
				"worker-3 acquired token 1",
			} {
				i := slices.IndexFunc(steps[at:], func(s string) bool { return strings.Contains(s, w) })
				if i < 0 {
					t.Fatalf("timeline lacks %q after step %d:\n%s", w, at, strings.Join(steps, "\n"))
				}
				at += i + 1
			}
			screenshot(t, ctx, "resource", "")
			dialogs.none(t, ctx)
		})
	}
}
