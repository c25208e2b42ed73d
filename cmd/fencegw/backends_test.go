package main

// Private PostgreSQL clusters and Redis servers for the fault tests: each test
// gets its own, on free ports, so it may stop, restart or flush them without
// disturbing the shared services other tests use.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

// pgBinDir holds initdb and pg_ctl (FENCEGW_PG_BIN overrides it).
func pgBinDir() string {
	if d := os.Getenv("FENCEGW_PG_BIN"); d != "" {
		return d
	}
	return "/usr/lib/postgresql/15/bin"
}

// requireBinary skips the test if path is not an executable, except under
// CI=true, where a missing backend must fail rather than pass silently.
func requireBinary(t *testing.T, path string) string {
	t.Helper()
	if !filepath.IsAbs(path) {
		p, err := exec.LookPath(path)
		if err != nil {
			missing(t, path+" not found in PATH")
		}
		return p
	}
	if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		missing(t, path+" is not an executable")
	}
	return path
}

func missing(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("fault tests need private backends: " + msg)
	}
	t.Skip("fault tests need private backends: " + msg)
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// pgCluster is a private PostgreSQL cluster in a temporary directory.
type pgCluster struct {
	t    *testing.T
	bin  string
	dir  string
	port int
	// asUser runs the PostgreSQL binaries as this user when the test runs
	// as root (PostgreSQL refuses to run as root); "" runs them directly.
	asUser string
	mu     sync.Mutex
	log    bytes.Buffer
}

// URL is the cluster's connection URL (database postgres, user postgres).
func (c *pgCluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", c.port)
}

func (c *pgCluster) command(name string, args ...string) *exec.Cmd {
	bin := filepath.Join(c.bin, name)
	if c.asUser != "" {
		return exec.Command("runuser", append([]string{"-u", c.asUser, "--", bin}, args...)...)
	}
	return exec.Command(bin, args...)
}

func (c *pgCluster) run(name string, args ...string) error {
	cmd := c.command(name, args...)
	out, err := cmd.CombinedOutput()
	c.mu.Lock()
	fmt.Fprintf(&c.log, "$ %s %s\n%s", name, strings.Join(args, " "), out)
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// startPostgres initialises and starts a private cluster; it is stopped and
// removed when the test ends.
func startPostgres(t *testing.T) *pgCluster {
	t.Helper()
	bin := pgBinDir()
	requireBinary(t, filepath.Join(bin, "initdb"))
	requireBinary(t, filepath.Join(bin, "pg_ctl"))
	c := &pgCluster{t: t, bin: bin, port: freePort(t)}
	// Not t.TempDir(): its parent is private to root, and the server runs
	// as the postgres user, which must reach the directory (and a short
	// path keeps the Unix socket under its length limit).
	dir, err := os.MkdirTemp("", "fencegw-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		requireBinary(t, "runuser")
		u, err := user.Lookup("postgres")
		if err != nil {
			missing(t, "running as root and there is no postgres user to run PostgreSQL as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.asUser = "postgres"
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := c.run("initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"); err != nil {
		t.Fatal(err)
	}
	c.dir = data
	// The port was free when freePort looked; another package's server
	// (the suite runs packages side by side) may take it before ours
	// binds it: then a fresh port, not a failed test.
	for attempt := 1; ; attempt++ {
		err := c.Start()
		if err == nil {
			break
		}
		if log, _ := os.ReadFile(filepath.Join(c.dir, "server.log")); attempt < 5 && bytes.Contains(log, []byte("Address already in use")) {
			c.port = freePort(t)
			continue
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.run("pg_ctl", "-D", c.dir, "-m", "immediate", "-w", "stop")
		if t.Failed() {
			c.mu.Lock()
			t.Logf("private PostgreSQL log:\n%s", c.log.String())
			c.mu.Unlock()
		}
	})
	return c
}

func (c *pgCluster) opts() string {
	return fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_buffers=32MB", c.port, filepath.Dir(c.dir))
}

// Start starts the cluster and waits until it accepts connections.
func (c *pgCluster) Start() error {
	if err := c.run("pg_ctl", "-D", c.dir, "-o", c.opts(), "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "30", "start"); err != nil {
		return err
	}
	return c.waitReady(10 * time.Second)
}

// Stop stops the cluster (fast: sessions are terminated, as in a restart).
func (c *pgCluster) Stop() error {
	return c.run("pg_ctl", "-D", c.dir, "-m", "fast", "-w", "-t", "30", "stop")
}

func (c *pgCluster) waitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, c.URL())
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("private PostgreSQL on port %d not ready: %v", c.port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redisServer is a private redis-server subprocess without persistence: a
// restart loses every key, as a failover to a replica that missed the last
// writes may.
type redisServer struct {
	t    *testing.T
	bin  string
	port int
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// startRedis starts a private Redis; it is killed when the test ends.
func startRedis(t *testing.T) *redisServer {
	t.Helper()
	r := &redisServer{t: t, bin: requireBinary(t, "redis-server")}
	t.Cleanup(r.Kill)
	// The port was free when freePort looked; another package's server
	// (the suite runs packages side by side) may take it before ours
	// binds it: then a fresh port, not a failed test, nor a test that
	// talks to the other server (and pauses a process nobody uses).
	for attempt := 1; ; attempt++ {
		r.port = freePort(t)
		err := r.Start()
		if err == nil {
			return r
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			t.Fatal(err)
		}
	}
}

// errPortTaken: the server's port turned out to be another process's.
var errPortTaken = errors.New("the port is another server's")

// URL is the server's connection URL.
func (r *redisServer) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

// Client returns a client for the server, closed when the test ends.
func (r *redisServer) Client() *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port)})
	r.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Start starts redis-server and waits until it answers PING.
func (r *redisServer) Start() error {
	r.mu.Lock()
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	done := make(chan struct{})
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		return err
	}
	r.cmd, r.done = cmd, done
	go func() { _ = cmd.Wait(); close(done) }()
	r.mu.Unlock()

	c := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port)})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			// The server that answered must be this one, not another
			// that holds the port (ours then exits, unable to bind it).
			if pid := redisPID(c); pid != cmd.Process.Pid {
				r.Kill()
				return fmt.Errorf("%w: port %d answers as process %d, not redis-server %d", errPortTaken, r.port, pid, cmd.Process.Pid)
			}
			return nil
		}
		select {
		case <-done:
			r.Kill()
			return fmt.Errorf("%w: redis-server on port %d exited at start", errPortTaken, r.port)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("private Redis on port %d not ready: %v", r.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisPID is the process id the server c talks to reports (0 if it
// does not say).
func redisPID(c *goredis.Client) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, _ := c.Info(ctx, "server").Result()
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, _ := strconv.Atoi(v)
			return pid
		}
	}
	return 0
}

// Kill stops the server with SIGKILL (no chance to save anything).
func (r *redisServer) Kill() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart kills the server and starts a new, empty one on the same port.
func (r *redisServer) Restart() error {
	r.Kill()
	return r.Start()
}
