package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// startStandby makes a synchronous streaming standby of primary
// (pg_basebackup -R, application_name standby1, which the primary's
// synchronous_standby_names then names), starts it and waits until the
// primary reports it in sync.
func startStandby(t *testing.T, primary *pgCluster) *pgCluster {
	t.Helper()
	requireBinary(t, filepath.Join(primary.bin, "pg_basebackup"))
	s := &pgCluster{t: t, bin: primary.bin, port: freePort(t), asUser: primary.asUser}
	dir, err := os.MkdirTemp("", "fencegw-pg-standby-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if primary.asUser != "" {
		if err := chownLike(dir, filepath.Dir(primary.dir)); err != nil {
			t.Fatal(err)
		}
	}
	s.dir = filepath.Join(dir, "data")
	if err := s.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres",
		"-D", s.dir, "-R", "-X", "stream", "--no-sync"); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=standby1'\n", primary.port)
	f, err := os.OpenFile(filepath.Join(s.dir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(conf)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.run("pg_ctl", "-D", s.dir, "-m", "immediate", "-w", "stop")
		if t.Failed() {
			s.mu.Lock()
			t.Logf("standby PostgreSQL log:\n%s", s.log.String())
			s.mu.Unlock()
			if b, err := os.ReadFile(filepath.Join(s.dir, "server.log")); err == nil {
				t.Logf("standby server.log:\n%s", b)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = 'standby1'", "ALTER SYSTEM SET synchronous_commit = 'on'", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for {
		var state string
		err := conn.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'").Scan(&state)
		if err == nil && state == "sync" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the standby is not in sync: %q %v", state, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

// chownLike gives dir the owner of like.
func chownLike(dir, like string) error {
	st, err := os.Stat(like)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("no owner of %s", like)
	}
	return os.Chown(dir, int(sys.Uid), int(sys.Gid))
}

// PostgreSQL fails over under load: the primary is killed (immediate stop,
// as a crash) in the middle of grants and writes, and its synchronous
// standby is promoted. The gateways, on a multi-host URL with
// target_session_attrs=read-write, fail closed meanwhile (503, nothing
// forwarded unchecked), serve again on their own after the promotion, and
// no token is issued twice or goes back.
func TestFailoverPostgres(t *testing.T) {
	primary := startPostgres(t)
	standby := startStandby(t, primary)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2&target_session_attrs=read-write", primary.port, standby.port)
	up := newUpstream(t)
	ps := startReplicas(t, 2, "--postgres", url, "--upstream", "svc="+up.URL,
		"--forward-timeout", "5s", "--drain-period", "1s", "--grant-wait", "2s", "--pg-statement-timeout", "2s")
	bases := []string{ps[0].url(), ps[1].url()}

	c := &churn{ledger: newTokenLedger(), outcomes: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	c.run(ctx, &wg, bases, 6, 4, "failover")
	time.Sleep(1500 * time.Millisecond)

	killAt := time.Now()
	if err := primary.run("pg_ctl", "-D", primary.dir, "-m", "immediate", "-w", "stop"); err != nil {
		t.Fatal(err)
	}
	forwarded := up.count()
	// No primary: fail closed.
	for i, base := range bases {
		_, g := grant(base, "fresh", "X", time.Second, 0)
		want503(t, fmt.Sprintf("replica %d: grant with no primary", i), g, "store_unavailable")
	}
	time.Sleep(500 * time.Millisecond)
	if n := up.count(); n > forwarded {
		// Writes admitted under a fence before the kill may still finish
		// (within --pg-session-check); none may start after.
		t.Logf("%d writes finished after the primary died (admitted before)", n-forwarded)
	}
	promoteAt := time.Now()
	if err := standby.run("pg_ctl", "-D", standby.dir, "-w", "promote"); err != nil {
		t.Fatal(err)
	}
	c.afterFault.Store(true)
	t.Logf("primary killed, standby promoted %v later", promoteAt.Sub(killAt).Round(time.Millisecond))
	for i, base := range bases {
		for {
			l, g := grant(base, fmt.Sprintf("back-%d", i), "B", time.Second, 0)
			if g.code == http.StatusCreated {
				t.Logf("replica %d granted again %v after the promotion (token %d)", i, time.Since(promoteAt).Round(time.Millisecond), l.Token)
				break
			}
			if time.Since(promoteAt) > 30*time.Second {
				t.Fatalf("replica %d does not serve 30 s after the promotion: %v", i, g)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	cancel()
	wg.Wait()
	c.log(t)
	if c.count("after write 200") == 0 {
		t.Error("no write went through after the promotion")
	}
	c.ledger.check(t, killAt, promoteAt, bases)
	up.checkOrder(t)
}
