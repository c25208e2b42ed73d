// Command fencegw-torture proves fencegw's guarantees under faults: worker
// processes take leases with short TTLs and write through the gateway to a
// recording upstream, a nemesis kills (-9), pauses and restarts gateways,
// PostgreSQL and Redis and delays or drops upstream answers, and a checker
// compares what the upstream received with what every worker saw.
//
//	fencegw-torture --mode embedded --duration 1m
//	fencegw-torture --mode redis --gateway-bin ./fencegw --duration 30m
//	fencegw-torture --build-tags fencegw_break_highest_seen --expect-violations
//	fencegw-torture --mode postgres --faults failover-postgres   (its own primary + standby on 5445/5446)
//	fencegw-torture --mode embedded --faults disk-full           (root: --data on a small tmpfs)
//	fencegw-torture --mode embedded --faults stall-disk          (root: --data on a loop device whose writes stall)
//	fencegw-torture check [--drain-period D] DIR/history.json   (check a saved history again)
//
// Exit status: 0 the run passed (or, with --expect-violations, the checker
// found violations); 1 it failed or was void; 2 bad flags; 3 the harness
// could not run.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fencegw/fencegw/torture"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if err := torture.WorkerMain(os.Args[2:], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "fencegw-torture worker:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "check" {
		os.Exit(recheck(os.Args[2:], os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var (
		cfg       torture.Config
		bin, tags string
		faults    string
		out       string
		jsonPath  string
		expectBad bool
		quiet     bool
		history   bool
		inProcess bool
		seed      uint64
	)
	fs := flag.NewFlagSet("fencegw-torture", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Mode, "mode", torture.ModeEmbedded, "storage mode: embedded, postgres or redis (postgres + redis)")
	fs.DurationVar(&cfg.Duration, "duration", time.Minute, "how long the workers and the nemesis run")
	fs.StringVar(&bin, "gateway-bin", "", "the fencegw binary under test (default: go build ./cmd/fencegw)")
	fs.StringVar(&tags, "build-tags", "", "build tags for the default build (e.g. fencegw_break_highest_seen)")
	fs.IntVar(&cfg.Replicas, "replicas", 0, "gateway replicas sharing the store (default 1 embedded, 2 otherwise)")
	fs.IntVar(&cfg.WorkerGroups, "worker-procs", 4, "worker processes")
	fs.IntVar(&cfg.Goroutines, "goroutines", 4, "workers per process")
	fs.BoolVar(&inProcess, "in-process", false, "run workers as goroutines of this process (no worker pauses)")
	fs.IntVar(&cfg.Resources, "resources", 6, "resources to contend for")
	fs.IntVar(&cfg.MaxWrites, "writes-per-lease", 6, "writes per lease, 1 to this many")
	fs.DurationVar(&cfg.TTL, "ttl", 300*time.Millisecond, "lease TTL")
	fs.DurationVar(&cfg.ForwardTimeout, "forward-timeout", 300*time.Millisecond, "the gateway's --forward-timeout")
	fs.DurationVar(&cfg.DrainPeriod, "drain-period", time.Second, "the gateway's --drain-period")
	fs.DurationVar(&cfg.GrantWait, "grant-wait", 2*time.Second, "the gateway's --grant-wait")
	fs.StringVar(&cfg.PGCluster, "pg-cluster", "", "the pg_ctlcluster cluster that serves --postgres, which the nemesis restarts (default main)")
	fs.StringVar(&cfg.Postgres, "postgres", "", "PostgreSQL URL (default postgres://postgres@127.0.0.1:5432/fencegw_torture, created if missing)")
	fs.StringVar(&cfg.Redis, "redis", "", "Redis URL (default redis://127.0.0.1:6379/0; the nemesis FLUSHALLs and restarts this server)")
	fs.Int64Var(&cfg.TokenBase, "token-base", torture.DefaultTokenBase, "seed each resource's last token to this (above 2^53); 0: start at 1")
	fs.StringVar(&faults, "faults", "", "comma-separated fault kinds (default: all of the mode's)")
	fs.DurationVar(&cfg.FaultGap, "fault-gap", 1500*time.Millisecond, "pause between faults")
	fs.IntVar(&cfg.TheftPermille, "theft-permille", 50, "per mille of worker rounds that steal a lease's key, and of grants followed by a write to another resource's path")
	fs.Uint64Var(&seed, "seed", 0, "random seed (default: random, printed)")
	fs.StringVar(&out, "dir", "", "directory for data, logs and history (default: a temporary one, kept on failure)")
	fs.StringVar(&jsonPath, "json", "", "write the report as JSON to this file")
	fs.BoolVar(&expectBad, "expect-violations", false, "succeed only if the checker finds violations (for deliberately broken builds)")
	fs.BoolVar(&quiet, "quiet", false, "no progress lines")
	fs.BoolVar(&history, "history", false, "write the whole history to DIR/history.json even if the run passed (it is always written on failure)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fencegw-torture: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if cfg.TheftPermille < 1 || cfg.TheftPermille > 1000 {
		fmt.Fprintf(stderr, "fencegw-torture: --theft-permille: %d is not between 1 and 1000\n", cfg.TheftPermille)
		return 2
	}
	cfg.Seed = seed
	if faults != "" {
		cfg.Faults = strings.Split(faults, ",")
	}
	if !quiet {
		cfg.Log = stderr
	}

	dir := out
	if dir == "" {
		d, err := os.MkdirTemp("", "fencegw-torture-")
		if err != nil {
			fmt.Fprintln(stderr, "fencegw-torture:", err)
			return 3
		}
		dir = d
	}
	cfg.Dir = dir
	if bin == "" {
		bin = filepath.Join(dir, "fencegw")
		build := exec.CommandContext(ctx, "go", "build", "-tags", tags, "-o", bin, "github.com/fencegw/fencegw/cmd/fencegw")
		build.Stdout, build.Stderr = stderr, stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(stderr, "fencegw-torture: build the gateway:", err)
			return 3
		}
	} else if tags != "" {
		fmt.Fprintln(stderr, "fencegw-torture: --build-tags applies only without --gateway-bin")
		return 2
	}
	cfg.Binary = bin
	if !inProcess {
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintln(stderr, "fencegw-torture:", err)
			return 3
		}
		cfg.WorkerCommand = []string{self, "worker"}
	}

	res, err := torture.Run(ctx, cfg)
	if err != nil && res == nil {
		fmt.Fprintln(stderr, "fencegw-torture:", err)
		fmt.Fprintln(stderr, "fencegw-torture: logs in", dir)
		return 3
	}
	if history || !res.Report.OK() {
		if b, jerr := json.Marshal(res); jerr == nil {
			_ = os.WriteFile(filepath.Join(dir, "history.json"), b, 0o644)
		}
	}
	if jsonPath != "" {
		b, _ := json.MarshalIndent(struct {
			Mode      string         `json:"mode"`
			Tags      string         `json:"build_tags,omitempty"`
			Seed      uint64         `json:"seed"`
			Duration  string         `json:"duration"`
			Report    torture.Report `json:"report"`
			Violating int            `json:"violations"`
		}{res.Config.Mode, tags, res.Config.Seed, res.Config.Duration.String(), res.Report, res.Report.ViolationCount()}, "", " ")
		if werr := os.WriteFile(jsonPath, b, 0o644); werr != nil {
			fmt.Fprintln(stderr, "fencegw-torture:", werr)
		}
	}
	fmt.Fprintf(stdout, "fencegw-torture %s mode, seed %d, %v%s\n%s", res.Config.Mode, res.Config.Seed, res.Config.Duration,
		map[bool]string{true: ", build tags " + tags, false: ""}[tags != ""], res.Report)
	if err != nil {
		fmt.Fprintln(stderr, "fencegw-torture:", err)
		return 3
	}
	passed := res.Report.OK()
	if passed && out == "" {
		os.RemoveAll(dir)
	} else {
		fmt.Fprintln(stdout, "data, logs and history in", dir)
	}
	switch {
	case expectBad && res.Report.ViolationCount() > 0:
		fmt.Fprintln(stdout, "expected violations: found")
		return 0
	case expectBad:
		fmt.Fprintln(stdout, "expected violations: NONE FOUND")
		return 1
	case passed:
		return 0
	default:
		return 1
	}
}

// recheck runs the checker on a saved history (DIR/history.json).
func recheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	drain := fs.Duration("drain-period", 0, "the gateway's drain period, if the history does not record it")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: fencegw-torture check [--drain-period D] history.json")
		return 2
	}
	b, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "fencegw-torture:", err)
		return 3
	}
	var saved struct {
		History torture.History `json:"history"`
	}
	if err := json.Unmarshal(b, &saved); err != nil {
		fmt.Fprintln(stderr, "fencegw-torture:", err)
		return 3
	}
	if *drain > 0 {
		saved.History.DrainPeriod = *drain
	}
	r := torture.Check(saved.History)
	fmt.Fprint(stdout, r)
	if !r.OK() {
		return 1
	}
	return 0
}
