package torture

// One torture run (Run): the storage mode, the gateway replicas, the worker
// processes and the upstream, the nemesis, and the checked history at the
// end; WorkerMain is a worker process's side.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencegw/fencegw/auth"
)

// Storage modes of the gateway under test.
const (
	ModeEmbedded = "embedded"
	ModePostgres = "postgres"
	ModeRedis    = "redis" // --postgres and --redis
)

// Fault kinds the nemesis knows.
const (
	FaultKillGateway     = "kill-gateway"     // kill -9 a replica, restart it on the same data
	FaultPauseGateway    = "pause-gateway"    // SIGSTOP a replica past the TTL, SIGCONT
	FaultStopInWrite     = "stop-in-write"    // SIGSTOP the replica forwarding a write while the upstream holds it
	FaultPauseWorker     = "pause-worker"     // SIGSTOP a worker process past its TTL, SIGCONT
	FaultSlowUpstream    = "slow-upstream"    // answers after the forward timeout (the write still lands)
	FaultDropUpstream    = "drop-upstream"    // connections closed instead of answers, half after applying
	FaultRestartPostgres = "restart-postgres" // stop and start the PostgreSQL cluster
	FaultRestartRedis    = "restart-redis"    // FLUSHALL, shutdown nosave, start
	// FaultRestartPostgresInWrite stops PostgreSQL while writes are held
	// past the forward timeout by the upstream: their drain periods must
	// survive the store being down when they time out.
	FaultRestartPostgresInWrite = "restart-postgres-in-write"
	// FaultKillInWrite kill -9s the replica that forwarded a write while
	// the upstream holds it; the write lands later, after the lease it was
	// sent under has expired (guarantee 7: a replica's death is an unknown
	// outcome, so the next grant must wait out a drain).
	FaultKillInWrite = "kill-in-write"
)

// DefaultFaults are the fault kinds used in each mode.
var DefaultFaults = map[string][]string{
	ModeEmbedded: {FaultKillGateway, FaultKillInWrite, FaultPauseGateway, FaultStopInWrite, FaultPauseWorker, FaultSlowUpstream, FaultDropUpstream},
	ModePostgres: append([]string{FaultKillGateway, FaultKillInWrite, FaultPauseGateway, FaultStopInWrite, FaultPauseWorker, FaultSlowUpstream, FaultDropUpstream, FaultRestartPostgres, FaultRestartPostgresInWrite, FaultStoreRefusesDrain}, sessionFaults...),
	ModeRedis:    append([]string{FaultKillGateway, FaultKillInWrite, FaultPauseGateway, FaultStopInWrite, FaultPauseWorker, FaultSlowUpstream, FaultDropUpstream, FaultRestartPostgres, FaultRestartPostgresInWrite, FaultRestartRedis, FaultStoreRefusesDrain}, sessionFaults...),
}

// OptInFaults are the fault kinds a mode knows beyond its defaults, which
// --faults must name: each needs what a plain run lacks (root and a mount,
// a cluster or a network namespace of its own).
var OptInFaults = map[string][]string{
	ModeEmbedded: {FaultDiskFull, FaultStoreRefusesDrain},
	ModePostgres: {FaultFailoverPostgres, FaultPartition},
	ModeRedis:    {FaultFailoverPostgres, FaultPartition},
}

// DefaultTokenBase puts every resource's tokens just above 2^53, where a
// token that passes through a float64 loses its last bit.
const DefaultTokenBase = 1<<53 + 1

// Config is one torture run.
type Config struct {
	Mode     string
	Binary   string // the fencegw binary under test
	Dir      string // data, logs and the history go here
	Duration time.Duration
	Replicas int // gateways sharing the store (1 in embedded mode)
	// WorkerCommand, if set, runs each worker group as a process
	// (WorkerCommand + one JSON WorkerConfig argument), which the nemesis
	// can pause; otherwise workers are goroutines of this process.
	WorkerCommand []string
	WorkerGroups  int
	Goroutines    int // per group
	Resources     int
	MaxWrites     int // writes per lease, 1..MaxWrites
	TTL           time.Duration
	// ForwardTimeout and DrainPeriod are passed to the gateway; upstream
	// delays lie between them, so a correct gateway is never blamed for a
	// write that lands after the drain period it chose.
	ForwardTimeout time.Duration
	DrainPeriod    time.Duration
	GrantWait      time.Duration
	Postgres       string // URL, postgres and redis modes
	// PGCluster is the pg_ctlcluster cluster the nemesis restarts ("main"
	// if empty): a cluster of its own lets long runs leave the machine's
	// PostgreSQL alone.
	PGCluster string
	// PairPorts are the ports of the private primary and standby the
	// failover-postgres fault runs on (default 5445, 5446).
	PairPorts [2]int
	Redis     string // URL, redis mode
	TokenBase int64  // 0: do not seed
	Faults    []string
	// FaultGap is the pause between two faults (random in [gap/2, gap]).
	FaultGap time.Duration
	// TheftPermille of each worker's rounds are a theft (see
	// WorkerConfig.TheftPermille); default 50.
	TheftPermille int
	Seed          uint64
	Log           io.Writer // progress; nil discards
}

func (c *Config) defaults() error {
	if c.Mode == "" {
		c.Mode = ModeEmbedded
	}
	if _, ok := DefaultFaults[c.Mode]; !ok {
		return fmt.Errorf("unknown mode %q (want embedded, postgres or redis)", c.Mode)
	}
	if c.Binary == "" {
		return errNoBinary
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
		if c.Mode != ModeEmbedded {
			c.Replicas = 2
		}
	}
	if c.Mode == ModeEmbedded && c.Replicas != 1 {
		return errors.New("embedded mode has one replica")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Duration, time.Minute)
	def(&c.TTL, 300*time.Millisecond)
	def(&c.ForwardTimeout, 300*time.Millisecond)
	def(&c.DrainPeriod, time.Second)
	def(&c.GrantWait, 2*time.Second)
	def(&c.FaultGap, 1500*time.Millisecond)
	if c.DrainPeriod < c.ForwardTimeout+400*time.Millisecond {
		return errors.New("the drain period must exceed the forward timeout by 400ms: upstream delays lie between them")
	}
	if c.WorkerGroups <= 0 {
		c.WorkerGroups = 4
	}
	if c.Goroutines <= 0 {
		c.Goroutines = 4
	}
	if c.Resources <= 0 {
		c.Resources = 6
	}
	if c.MaxWrites <= 0 {
		c.MaxWrites = 6
	}
	if c.TheftPermille <= 0 {
		c.TheftPermille = 50
	}
	if len(c.Faults) == 0 {
		c.Faults = DefaultFaults[c.Mode]
	}
	if c.Mode != ModeEmbedded && c.Postgres == "" {
		c.Postgres = "postgres://postgres@127.0.0.1:5432/fencegw_torture?sslmode=disable"
	}
	if c.Mode == ModeRedis && c.Redis == "" {
		c.Redis = "redis://127.0.0.1:6379/0"
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return nil
}

// Result is a run's history and verdict.
type Result struct {
	Config  Config  `json:"-"`
	History History `json:"history"`
	Report  Report  `json:"report"`
}

// Run runs the torture and checks its history. An error means the harness
// could not run (the gateway did not start, a service is missing); a
// failed check is a Result whose Report is not OK.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(cfg.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
	gwLog, err := openLog(filepath.Join(cfg.Dir, "gateway.log"))
	if err != nil {
		return nil, err
	}
	defer gwLog.Close()

	// Services the nemesis stops are running again when the run ends,
	// whatever happened.
	var pg *Postgres
	var rd *Redis
	var pair *pgPair
	if cfg.Mode != ModeEmbedded && slices.Contains(cfg.Faults, FaultFailoverPostgres) {
		if cfg.PairPorts == [2]int{} {
			cfg.PairPorts = defaultPairPorts
		}
		if pair, err = startPGPair(ctx, filepath.Join(cfg.Dir, "pg"), cfg.PairPorts, "fencegw_torture", logf); err != nil {
			if pair != nil {
				pair.stop()
			}
			return nil, fmt.Errorf("private PostgreSQL primary and standby: %w", err)
		}
		defer pair.stop()
		cfg.Postgres = pair.URL()
	}
	if cfg.Mode != ModeEmbedded {
		pg = &Postgres{URL: cfg.Postgres, Cluster: cfg.PGCluster, pair: pair}
		defer func() {
			if err := pg.Ensure(context.WithoutCancel(ctx)); err != nil {
				logf("could not restart PostgreSQL: %v", err)
			}
		}()
		if pair == nil { // startPGPair created its database
			if err := pg.CreateDatabase(ctx); err != nil {
				return nil, fmt.Errorf("PostgreSQL at %s: %w", cfg.Postgres, err)
			}
		}
	}
	if cfg.Mode == ModeRedis {
		rd = &Redis{}
		if u, err := url.Parse(cfg.Redis); err == nil && u.Port() != "" {
			rd.Port = u.Port()
		}
		defer func() {
			if err := rd.Ensure(context.WithoutCancel(ctx)); err != nil {
				logf("could not restart Redis: %v", err)
			}
		}()
	}

	up, err := NewUpstream()
	if err != nil {
		return nil, err
	}
	nonce := strconv.FormatUint(cfg.Seed%1_000_000, 36) + strconv.FormatInt(time.Now().Unix()%100_000, 36)
	resources := make([]string, cfg.Resources)
	for i := range resources {
		resources[i] = fmt.Sprintf("torture/%s/%02d", nonce, i)
	}
	// One API key per worker goroutine, each its own principal: a lease is
	// bound to the key that acquired it, and the thieves use their own keys
	// with their siblings' lease ids.
	groupNames := make([]string, cfg.WorkerGroups)
	groupKeys := make([][]string, cfg.WorkerGroups)
	var authFile auth.File
	for g := range groupNames {
		groupNames[g] = fmt.Sprintf("%s-w%d", nonce, g)
		for i := range cfg.Goroutines {
			key := auth.GenerateKey()
			groupKeys[g] = append(groupKeys[g], key)
			authFile.Keys = append(authFile.Keys, auth.Key{Name: HolderName(groupNames[g], i), SHA256: auth.Hash(key), Role: "worker",
				Resources: []string{"torture/" + nonce + "/"}})
		}
	}
	authPath := filepath.Join(cfg.Dir, "auth.json")
	if err := writeJSON(authPath, authFile); err != nil {
		return nil, err
	}
	args := []string{"--upstream", "rec=" + up.URL, "--forward-timeout", cfg.ForwardTimeout.String(),
		"--drain-period", cfg.DrainPeriod.String(), "--grant-wait", cfg.GrantWait.String(), "--log-level", "warn",
		"--auth-file", authPath, "--route", WritePathRoute("rec"),
		// Nothing balances load in front of the replicas: Stop's SIGTERM
		// should drain at once, not serve on for a load balancer.
		"--shutdown-delay", "0"}
	if slices.Contains(cfg.Faults, FaultRedisDownInShutdown) { // nemesis_shutdown_redis.go
		args = append(args, "--shutdown-delay", shutdownRedisDelay.String())
	}
	var dataDisk, refusing string
	var slowDisk *SlowDisk
	switch cfg.Mode {
	case ModeEmbedded:
		data := filepath.Join(cfg.Dir, "data")
		args = append(args, "--data", data)
		if slices.Contains(cfg.Faults, FaultDiskFull) { // nemesis_disk.go
			umount, err := mountSmallDisk(data)
			if err != nil {
				return nil, err
			}
			defer func() {
				if err := umount(); err != nil {
					logf("%v", err)
				}
			}()
			dataDisk = data
		}
		if slices.Contains(cfg.Faults, FaultStallDisk) { // nemesis_disk.go, slowdisk.go
			if dataDisk != "" {
				return nil, errors.New("disk-full and stall-disk each mount the store's disk: run them apart")
			}
			d, err := MountSlowDisk(cfg.Dir, data, slowDiskSize)
			if err != nil {
				return nil, err
			}
			defer func() {
				if err := d.Close(); err != nil {
					logf("remove the slow disk: %v", err)
				}
			}()
			slowDisk = d
		}
		if slices.Contains(cfg.Faults, FaultStoreRefusesDrain) { // nemesis_drain.go
			if dataDisk != "" || slowDisk != nil {
				return nil, errors.New("disk-full, stall-disk and store-refuses-drain each mount the data directory: run them apart")
			}
			umount, err := mountRefusingDisk(ctx, data)
			if err != nil {
				return nil, err
			}
			defer func() {
				if err := umount(); err != nil {
					logf("%v", err)
				}
			}()
			refusing = filepath.Join(data, "fencegw.db")
		}
		if cfg.TokenBase > 0 {
			if err := SeedBolt(data, resources, cfg.TokenBase); err != nil {
				return nil, fmt.Errorf("seed tokens: %w", err)
			}
		}
	case ModePostgres:
		args = append(args, "--postgres", cfg.Postgres)
	case ModeRedis:
		args = append(args, "--postgres", cfg.Postgres, "--redis", cfg.Redis)
	}
	lw := &lockedWriter{w: gwLog}
	replicas := make([]*Replica, cfg.Replicas)
	for i := range replicas {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		replicas[i] = &Replica{Index: i, Addr: addr, bin: cfg.Binary, args: args, log: lw}
		if slowDisk != nil {
			replicas[i].joinDisk = slowDisk.Join
		}
	}
	var ns *netns
	if cfg.needsPartition() { // netns.go
		if ns, err = partitionReplica(ctx, &cfg, replicas[len(replicas)-1], up, rd); err != nil {
			up.Close(0)
			return nil, err
		}
		defer ns.remove()
	}
	defer func() {
		for _, r := range replicas {
			r.Stop()
		}
	}()
	for _, r := range replicas {
		if err := r.Start(); err != nil {
			up.Close(0)
			return nil, fmt.Errorf("%w; log: %s", err, gwLog.Name())
		}
	}
	if cfg.TokenBase > 0 && pg != nil { // the gateways created the tables
		if err := pg.SeedTokens(ctx, resources, cfg.TokenBase); err != nil {
			up.Close(0)
			return nil, fmt.Errorf("seed tokens: %w", err)
		}
	}
	logf("%s mode: %d replica(s), %d×%d workers on %d resources, TTL %v, forward timeout %v, drain %v, %v",
		cfg.Mode, cfg.Replicas, cfg.WorkerGroups, cfg.Goroutines, len(resources), cfg.TTL, cfg.ForwardTimeout, cfg.DrainPeriod, cfg.Duration)

	// Workers.
	urls := make([]string, len(replicas))
	for i, r := range replicas {
		urls[i] = r.URL()
	}
	rec := &memRecorder{}
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	var workers sync.WaitGroup
	var procs []*workerProc
	for g := range cfg.WorkerGroups {
		wc := WorkerConfig{Name: groupNames[g], Gateways: urls, Upstream: "rec", Resources: resources,
			Goroutines: cfg.Goroutines, TTL: cfg.TTL, Wait: cfg.TTL, Timeout: cfg.ForwardTimeout + cfg.DrainPeriod + 3*time.Second,
			MaxWrites: cfg.MaxWrites, Seed: cfg.Seed + uint64(g), Keys: groupKeys[g], TheftPermille: cfg.TheftPermille,
			RouteTheftPermille: cfg.TheftPermille}
		if slices.Contains(cfg.Faults, FaultSlowBody) { // nemesis_sessions.go
			wc.SlowBodyPermille = 80
			if cfg.needsPartition() {
				// Only the bodies on the way to the cut replica when its
				// link goes down are at stake: more of them, but not so
				// many that every worker is stuck in one and none asks for
				// the resources meanwhile.
				wc.SlowBodyPermille = 120
			}
			wc.SlowBodyMin, wc.SlowBodyMax = cfg.slowBodyPause()
			wc.Timeout += wc.SlowBodyMax
		}
		if len(cfg.WorkerCommand) == 0 {
			wc.StallPermille = 60
			workers.Go(func() { RunWorkers(workCtx, wc, rec) })
			continue
		}
		wc.StallPermille = 20 // the rest comes from process pauses
		p, err := startWorkerProc(cfg.WorkerCommand, wc, filepath.Join(cfg.Dir, wc.Name+".json"), cfg.Duration+time.Minute, lw, rec)
		if err != nil {
			stopWork()
			return nil, err
		}
		procs = append(procs, p)
	}

	// Nemesis, until the end of the run; then let the writes settle.
	n := &nemesis{cfg: cfg, up: up, replicas: replicas, workers: procs, pg: pg, rd: rd, dataDisk: dataDisk, slowDisk: slowDisk, refusing: refusing, netns: ns, logf: logf,
		rng: rand.New(rand.NewPCG(cfg.Seed, 7))}
	runCtx, endRun := context.WithTimeout(ctx, cfg.Duration)
	defer endRun()
	n.run(runCtx)
	stopWork()
	for _, p := range procs {
		p.stop()
	}
	workers.Wait()
	up.Close(cfg.DrainPeriod + cfg.ForwardTimeout + time.Second)

	res := &Result{Config: cfg}
	rec.mu.Lock()
	res.History = History{Grants: rec.grants, Writes: rec.writes, Arrivals: up.Arrivals(), Faults: n.faults, LeaseOps: rec.ops, DrainPeriod: cfg.DrainPeriod}
	rec.mu.Unlock()
	res.Report = Check(res.History)
	for _, f := range n.faults {
		if f.Kind == FaultFailoverPostgres {
			if d, ok := firstGrantAfter(res.History.Grants, f.DownTo); ok {
				logf("failover at %s: first grant %v after the promotion began", f.DownTo.Format("15:04:05.000"), d.Round(time.Millisecond))
			}
		}
		if f.Kind == FaultStallDisk {
			d, _ := firstGrantAfter(res.History.Grants, f.End)
			logf("disk stalled from %s for %v: first grant %v after it resumed", f.Start.Format("15:04:05.000"),
				f.End.Sub(f.Start).Round(time.Millisecond), d.Round(time.Millisecond))
		}
		if f.Kind == FaultDiskFull {
			during := 0
			for _, g := range res.History.Grants {
				if g.Returned.After(f.Start) && g.Returned.Before(f.End) {
					during++
				}
			}
			d, _ := firstGrantAfter(res.History.Grants, f.End)
			logf("disk full from %s for %v: %d grant(s) meanwhile, first grant %v after it was freed", f.Start.Format("15:04:05.000"),
				f.End.Sub(f.Start).Round(time.Millisecond), during, d.Round(time.Millisecond))
		}
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
}

// writeJSON writes v to path, readable by its owner only (an auth file).
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// workerProc is a worker group running as a process.
type workerProc struct {
	cmd   *exec.Cmd
	stdin io.Closer
	done  chan struct{}
}

// The config, API keys included, goes in a file only its owner can read
// (path), not on the command line, which every local user can see.
func startWorkerProc(command []string, wc WorkerConfig, path string, limit time.Duration, log io.Writer, rec Recorder) (*workerProc, error) {
	if err := writeJSON(path, wc); err != nil {
		return nil, err
	}
	cmd := exec.Command(command[0], append(slices.Clone(command[1:]), "@"+path, limit.String())...)
	cmd.Stderr = log
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	p := &workerProc{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var r record
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			if r.Grant != nil {
				rec.Grant(*r.Grant)
			}
			if r.Write != nil {
				rec.Write(*r.Write)
			}
			if r.LeaseOp != nil {
				rec.LeaseOp(*r.LeaseOp)
			}
		}
		_ = cmd.Wait()
	}()
	return p, nil
}

func (p *workerProc) pause()  { _ = p.cmd.Process.Signal(syscall.SIGSTOP) }
func (p *workerProc) resume() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }

// stop asks the worker to finish (stdin closed) and waits for its records;
// it is killed if it does not finish in time.
func (p *workerProc) stop() {
	p.resume()
	_ = p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// WorkerMain is the worker process: args are a JSON WorkerConfig (or @ and
// the name of a file holding one) and a time limit. It works until stdin
// closes or the limit passes, writing its observations to stdout as JSON
// lines.
func WorkerMain(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) != 2 {
		return errors.New("usage: worker CONFIG-JSON|@FILE LIMIT")
	}
	config := []byte(args[0])
	if name, ok := strings.CutPrefix(args[0], "@"); ok {
		b, err := os.ReadFile(name)
		if err != nil {
			return fmt.Errorf("worker config: %w", err)
		}
		config = b
	}
	var wc WorkerConfig
	if err := json.Unmarshal(config, &wc); err != nil {
		return fmt.Errorf("worker config: %w", err)
	}
	limit, err := time.ParseDuration(args[1])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		cancel()
	}()
	w := bufio.NewWriter(stdout)
	rec := NewLineRecorder(w)
	RunWorkers(ctx, wc, rec)
	return w.Flush()
}
