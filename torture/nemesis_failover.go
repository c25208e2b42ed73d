package torture

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// FaultFailoverPostgres kills the PostgreSQL primary (immediate stop, as a
// crash) while writes are in flight and promotes its synchronous standby;
// the gateways, on a multi-host URL with target_session_attrs=read-write,
// must fail closed while there is no primary and serve again on their own.
// The old primary is then rebuilt as the new standby (pg_basebackup -R), so
// a run can fail over many times. With this fault in the list, the torture
// runs on a pair of private clusters of its own (Config.PairPorts), never on
// --postgres.
const FaultFailoverPostgres = "failover-postgres"

// defaultPairPorts are the private clusters' ports.
var defaultPairPorts = [2]int{5445, 5446}

// pgPair is a primary and its synchronous streaming standby, in dir.
type pgPair struct {
	bin     string
	dir     string
	asUser  string // PostgreSQL refuses to run as root
	ports   [2]int
	primary int // index of the current primary
	db      string
	logf    func(format string, args ...any)
}

func pgBinDir() string {
	if d := os.Getenv("FENCEGW_PG_BIN"); d != "" {
		return d
	}
	return "/usr/lib/postgresql/15/bin"
}

func (p *pgPair) data(i int) string { return filepath.Join(p.dir, "pg"+strconv.Itoa(i)) }

func (p *pgPair) run(ctx context.Context, name string, args ...string) error {
	bin := filepath.Join(p.bin, name)
	if p.asUser != "" {
		args = append([]string{"-u", p.asUser, "--", bin}, args...)
		bin = "runuser"
	}
	_, err := run(ctx, 60*time.Second, bin, args...)
	return err
}

// URL is the gateways' multi-host URL: whichever cluster accepts writes.
func (p *pgPair) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2&target_session_attrs=read-write",
		p.ports[0], p.ports[1], p.db)
}

func (p *pgPair) url(i int, db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2", p.ports[i], db)
}

// startPGPair initialises a primary in dir/pg0 with a database db and a
// synchronous standby in dir/pg1.
func startPGPair(ctx context.Context, dir string, ports [2]int, db string, logf func(string, ...any)) (*pgPair, error) {
	p := &pgPair{bin: pgBinDir(), dir: dir, ports: ports, db: db, logf: logf}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root and there is no postgres user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for d := dir; ; d = filepath.Dir(d) { // the server must reach its directory
			if d == dir {
				if err := os.Chown(d, uid, gid); err != nil {
					return nil, err
				}
			} else if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o001 == 0 {
				return nil, fmt.Errorf("the postgres user cannot reach %s (mode %v): choose a --dir it can", dir, st.Mode().Perm())
			}
			if d == "/" || d == "." {
				break
			}
		}
		p.asUser = "postgres"
	}
	if err := p.run(ctx, "initdb", "-D", p.data(0), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"); err != nil {
		return nil, err
	}
	if err := p.start(ctx, 0); err != nil {
		return p, err
	}
	c, err := pgx.Connect(ctx, p.url(0, "postgres"))
	if err != nil {
		return p, err
	}
	_, err = c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	c.Close(ctx)
	if err != nil {
		return p, err
	}
	if err := p.makeStandby(ctx, 1); err != nil {
		return p, err
	}
	return p, p.setSync(ctx, true)
}

func (p *pgPair) start(ctx context.Context, i int) error {
	sock := filepath.Dir(p.data(i))
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_buffers=32MB -c wal_level=replica", p.ports[i], sock)
	return p.run(ctx, "pg_ctl", "-D", p.data(i), "-o", opts, "-l", p.data(i)+".log", "-w", "-t", "30", "start")
}

func (p *pgPair) stopCluster(ctx context.Context, i int, mode string) error {
	return p.run(ctx, "pg_ctl", "-D", p.data(i), "-m", mode, "-w", "-t", "30", "stop")
}

// makeStandby (re)builds cluster i as a streaming standby of the primary.
func (p *pgPair) makeStandby(ctx context.Context, i int) error {
	if err := os.RemoveAll(p.data(i)); err != nil {
		return err
	}
	if err := p.run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(p.ports[p.primary]), "-U", "postgres",
		"-D", p.data(i), "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return err
	}
	// The name the primary's synchronous_standby_names waits for (the
	// last setting in the file wins over -R's).
	conf := fmt.Sprintf("\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=standby'\n", p.ports[p.primary])
	f, err := os.OpenFile(filepath.Join(p.data(i), "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return p.start(ctx, i)
}

// setSync makes the primary's commits wait for the standby (on), or not
// (while there is no standby to wait for); on waits until it is in sync.
func (p *pgPair) setSync(ctx context.Context, on bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, p.url(p.primary, "postgres"))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	names := ""
	if on {
		names = "standby"
	}
	for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = '" + names + "'", "ALTER SYSTEM SET synchronous_commit = 'on'", "SELECT pg_reload_conf()"} {
		if _, err := c.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	for on {
		var state string
		err := c.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'").Scan(&state)
		if err == nil && state == "sync" {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the standby is not in sync: %q %v", state, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// failover kills the primary, waits (no primary: writes must fail closed),
// promotes the standby and rebuilds the old primary as its standby.
func (n *nemesis) failover(ctx context.Context, f *Fault) error {
	if n.pg == nil || n.pg.pair == nil {
		return errNotApplicable
	}
	p := n.pg.pair
	old, next := p.primary, 1-p.primary
	if err := p.stopCluster(ctx, old, "immediate"); err != nil {
		return err
	}
	f.DownFrom = now().Add(100 * time.Millisecond) // writes admitted just before may still be on the wire
	sleep(ctx, n.between(300*time.Millisecond, time.Second))
	f.DownTo = now()
	if err := p.run(ctx, "pg_ctl", "-D", p.data(next), "-w", "-t", "30", "promote"); err != nil {
		return err
	}
	p.primary = next
	promoted := time.Now()
	// Commits would wait for a standby that is not there yet.
	if err := p.setSync(ctx, false); err != nil {
		return err
	}
	if err := p.makeStandby(ctx, old); err != nil {
		return err
	}
	if err := p.setSync(ctx, true); err != nil {
		return err
	}
	n.logf("failover: port %d promoted; port %d rebuilt as its synchronous standby in %v", p.ports[next], p.ports[old],
		time.Since(promoted).Round(time.Millisecond))
	return nil
}

// ensure leaves a primary running (and its standby, if it can).
func (p *pgPair) ensure(ctx context.Context) error {
	if !p.running(p.primary) {
		if err := p.start(ctx, p.primary); err != nil {
			return err
		}
	}
	if s := 1 - p.primary; !p.running(s) {
		_ = p.start(ctx, s)
	}
	return nil
}

func (p *pgPair) running(i int) bool {
	b, err := os.ReadFile(filepath.Join(p.data(i), "postmaster.pid"))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return err == nil && syscall.Kill(pid, 0) == nil
}

// stop stops both clusters.
func (p *pgPair) stop() {
	for i := range p.ports {
		if p.running(i) {
			if err := p.stopCluster(context.Background(), i, "immediate"); err != nil {
				p.logf("stop private PostgreSQL on port %d: %v", p.ports[i], err)
			}
		}
	}
}

// firstGrantAfter is how long after t a worker was first granted a lease.
func firstGrantAfter(grants []Grant, t time.Time) (time.Duration, bool) {
	var first time.Time
	for _, g := range grants {
		if g.Returned.After(t) && (first.IsZero() || g.Returned.Before(first)) {
			first = g.Returned
		}
	}
	return first.Sub(t), !first.IsZero()
}
