package torture

// The machine's PostgreSQL and Redis as a torture run drives them: stopped,
// started, checked and seeded through their own commands, each bounded in
// time.

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/storage/bolt"
)

// run runs a command with a bound on its time and returns its output.
func run(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Postgres is the machine's PostgreSQL cluster, which the nemesis restarts.
type Postgres struct {
	URL     string // the gateways' database
	Version string // pg_ctlcluster's version; "" finds the only one in /etc/postgresql
	Cluster string // "main" if empty
	// pair, if set, is the torture's own primary and standby
	// (nemesis_failover.go): Stop and Start act on its primary.
	pair *pgPair
}

func (p *Postgres) ctl(ctx context.Context, action string, extra ...string) error {
	if p.Version == "" {
		dirs, _ := os.ReadDir("/etc/postgresql")
		if len(dirs) != 1 {
			return fmt.Errorf("cannot tell the PostgreSQL version from /etc/postgresql (%d entries): set it", len(dirs))
		}
		p.Version = dirs[0].Name()
	}
	if p.Cluster == "" {
		p.Cluster = "main"
	}
	_, err := run(ctx, 60*time.Second, "pg_ctlcluster", append([]string{"--skip-systemctl-redirect", p.Version, p.Cluster, action}, extra...)...)
	return err
}

// Stop shuts the cluster down (fast mode: sessions are cut).
func (p *Postgres) Stop(ctx context.Context) error {
	if p.pair != nil {
		return p.pair.stopCluster(ctx, p.pair.primary, "fast")
	}
	return p.ctl(ctx, "stop", "-m", "fast")
}

// Start starts the cluster.
func (p *Postgres) Start(ctx context.Context) error {
	if p.pair != nil {
		return p.pair.ensure(ctx)
	}
	return p.ctl(ctx, "start")
}

// Ensure starts the cluster if it does not answer.
func (p *Postgres) Ensure(ctx context.Context) error {
	if p.ping(ctx) == nil {
		return nil
	}
	_ = p.Start(ctx)
	return waitFor(ctx, 30*time.Second, p.ping)
}

func (p *Postgres) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		return err
	}
	return c.Close(ctx)
}

// CreateDatabase creates the database of p.URL if it is missing, connecting
// to the "postgres" database of the same server.
func (p *Postgres) CreateDatabase(ctx context.Context) error {
	u, err := url.Parse(p.URL)
	if err != nil {
		return err
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" {
		return nil
	}
	u.Path = "/postgres"
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var exists bool
	if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", db).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		_, err = c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	}
	return err
}

// SeedTokens sets the last granted token of resources (never granted yet)
// to base, in the gateways' fences table.
func (p *Postgres) SeedTokens(ctx context.Context, resources []string, base int64) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "INSERT INTO fences (resource, token) SELECT unnest($1::text[]), $2 ON CONFLICT (resource) DO NOTHING", resources, base)
	return err
}

// Redis is the machine's Redis server, which the nemesis flushes and
// restarts.
type Redis struct {
	Port string // "6379" if empty
	// Bind is an address the server listens on besides 127.0.0.1 when
	// the nemesis restarts it (the partitioned replica's veth).
	Bind string
}

func (r *Redis) port() string {
	if r.Port == "" {
		return "6379"
	}
	return r.Port
}

func (r *Redis) cli(ctx context.Context, args ...string) (string, error) {
	return run(ctx, 10*time.Second, "redis-cli", append([]string{"-h", "127.0.0.1", "-p", r.port()}, args...)...)
}

func (r *Redis) ping(ctx context.Context) error {
	out, err := r.cli(ctx, "ping")
	if err == nil && !strings.Contains(out, "PONG") {
		err = fmt.Errorf("redis ping: %q", out)
	}
	return err
}

// FlushAll drops every key.
func (r *Redis) FlushAll(ctx context.Context) error {
	_, err := r.cli(ctx, "FLUSHALL")
	return err
}

// Shutdown stops the server without saving and waits until it is gone.
func (r *Redis) Shutdown(ctx context.Context) error {
	_, _ = r.cli(ctx, "shutdown", "nosave")
	return waitFor(ctx, 10*time.Second, func(ctx context.Context) error {
		if r.ping(ctx) == nil {
			return fmt.Errorf("redis still up")
		}
		return nil
	})
}

// Start starts a server without persistence and waits until it answers.
func (r *Redis) Start(ctx context.Context) error {
	bind := []string{"--bind", "127.0.0.1", "-::1"}
	if r.Bind != "" {
		// Not protected mode's loopback-only rule: the namespace's
		// replica comes from the veth.
		bind = append(bind, r.Bind, "--protected-mode", "no")
	}
	if _, err := run(ctx, 10*time.Second, "redis-server", append(append([]string{"--daemonize", "yes"}, bind...),
		"--port", r.port(), "--save", "", "--appendonly", "no")...); err != nil {
		return err
	}
	return waitFor(ctx, 10*time.Second, r.ping)
}

// Ensure starts the server if it does not answer.
func (r *Redis) Ensure(ctx context.Context) error {
	if r.ping(ctx) == nil {
		return nil
	}
	return r.Start(ctx)
}

func waitFor(ctx context.Context, d time.Duration, ok func(context.Context) error) error {
	end := time.Now().Add(d)
	for {
		err := ok(ctx)
		if err == nil || time.Now().After(end) || ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// SeedBolt writes, before the gateway first opens it, an embedded store
// file in which resources were last granted token base (bolt.Seed).
func SeedBolt(dataDir string, resources []string, base int64) error {
	return bolt.Seed(filepath.Join(dataDir, "fencegw.db"), base, resources...)
}
