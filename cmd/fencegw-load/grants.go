package main

// -grants: durable grants per second through the gateway, beside etcd's
// lock acquisitions with -etcd-locks, and the gateway's memory per resource.

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/fencegw/fencegw/bench"
)

func runGrants(ctx context.Context, o options, out io.Writer) error {
	g, err := measureGrants(ctx, o, out)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "setup\tgrants\terrors\tgrants/s\tp50 µs\tp90 µs\tp99 µs\tmax µs\tserver CPU µs/grant\t")
	r := g.gateway
	cpu := "-"
	if g.gatewayCPU > 0 {
		cpu = strconv.FormatFloat(float64(g.gatewayCPU)/float64(time.Microsecond), 'f', 1, 64)
	}
	fmt.Fprintf(tw, "gateway\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", r.Requests, r.Errors, r.PerSecond(), us(r.Latency.P50), us(r.Latency.P90), us(r.Latency.P99), us(r.Latency.Max), cpu)
	if g.etcd != nil {
		e := g.etcd
		f := func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
		fmt.Fprintf(tw, "etcd (LeaseGrant + put-if-absent)\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%.1f\t\n", e.Acquisitions, e.Errors, e.PerSecond,
			f(e.P50US), f(e.P90US), f(e.P99US), f(e.MaxUS), float64(e.ServerCPU)/float64(time.Microsecond))
	}
	_ = tw.Flush()
	if g.etcd != nil && g.etcd.PerSecond > 0 {
		fmt.Fprintf(out, "grants ÷ etcd acquisitions: %.2f×\n", r.PerSecond()/g.etcd.PerSecond)
	}
	if g.memory != "" {
		fmt.Fprintln(out, g.memory)
	}
	if g.etcd != nil && g.etcd.Errors > 0 {
		fmt.Fprintf(out, "etcd refused %d acquisitions (not counted in its rate); first: %s\n", g.etcd.Errors, g.etcd.FirstError)
	}
	if r.Errors > 0 {
		return fmt.Errorf("%d grants failed; first: %w", r.Errors, r.FirstErr)
	}
	return g.etcdErr
}

// grantsRun is what one -grants run measured.
type grantsRun struct {
	gateway    bench.Result
	gatewayCPU time.Duration // the gateway process's CPU per grant; 0 if unknown
	// anonPerResource is the gateway process's anonymous memory after the
	// run per resource granted, in bytes (0 if unknown); memory says it
	// in full.
	anonPerResource float64
	anonResources   int64 // the fresh resources anonPerResource was taken over
	memory          string
	etcd            *etcdResult // nil without -etcd-locks, or if etcd failed (etcdErr)
	etcdErr         error
}

// measureGrants drives the gateway's grants on fresh resources, then, with
// -etcd-locks, etcd's acquisitions the same way.
func measureGrants(ctx context.Context, o options, out io.Writer) (grantsRun, error) {
	var g grantsRun
	var etcdBin, locksBin string
	if o.etcdLocks != "" {
		var err error
		if etcdBin, locksBin, err = lookEtcd(o.etcd, o.etcdLocks); err != nil {
			return g, err
		}
	}
	e, err := start(ctx, o, o.acquirers, nil)
	if err != nil {
		return g, err
	}
	defer e.close()
	prefix := "fencegw-load:grant:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	var seq atomic.Int64
	op := func(ctx context.Context, _, _ int) error {
		// A short TTL: these leases are never written under.
		_, err := bench.Acquire(ctx, e.client, e.gateway, prefix+strconv.FormatInt(seq.Add(1), 10), "fencegw-load", time.Second)
		return err
	}
	fmt.Fprintf(out, "fencegw-load -grants: %d acquirers on fresh resources, %s, GOMAXPROCS=%d (the load generator shares the CPUs with the gateway)\n",
		o.acquirers, o.duration, runtime.GOMAXPROCS(0))
	if o.warmup > 0 {
		bench.RunFor(ctx, "warm-up", o.warmup, o.acquirers, op)
	}
	gw := e.peers["gateway"]
	var anon0 int64
	seq0 := seq.Load()
	if gw != nil {
		if m, err := bench.ReadMemory(gw.cmd.Process.Pid); err == nil {
			anon0 = m["RssAnon"]
		}
	}
	// The gateway's own CPU per grant (its process, with -servers process):
	// on a shared machine, or a slow disk, grants/s says more about the
	// neighbours and the fsyncs than about the gateway.
	var cpu0 time.Duration
	if gw != nil {
		cpu0 = gw.cpu()
	}
	g.gateway = bench.RunFor(ctx, "grants", o.duration, o.acquirers, op)
	if gw != nil && g.gateway.Requests > 0 {
		g.gatewayCPU = (gw.cpu() - cpu0) / time.Duration(g.gateway.Requests)
		g.memory, _ = memoryReport(gw, g.gateway.Requests)
		// The quotient of the whole by the grants falls as a run grows
		// longer (the process holds its bounded cache and the heap's
		// headroom anyway); the growth since the warm-up per resource
		// granted does not.
		if m, err := bench.ReadMemory(gw.cmd.Process.Pid); err == nil {
			n := seq.Load() - seq0
			g.anonPerResource, g.anonResources = float64(m["RssAnon"]-anon0)*1024/float64(n), n
			g.memory += fmt.Sprintf("; anonymous growth since the warm-up: %+.0f B per resource (%d KiB over %d grants)", g.anonPerResource, m["RssAnon"]-anon0, n)
		}
	}
	if gw != nil && o.figures != "" && o.memResources > 0 {
		// What a resource ever granted costs the gateway: grant fresh
		// resources (untimed) until memResources were granted since the
		// warm-up, and charge them the growth of its anonymous memory.
		for seq.Load()-seq0 < int64(o.memResources) && ctx.Err() == nil {
			if r := bench.RunFor(ctx, "memory", time.Second, o.acquirers, op); r.Errors > 0 {
				return g, fmt.Errorf("memory: %d grants failed; first: %w", r.Errors, r.FirstErr)
			}
		}
		m, err := bench.ReadMemory(gw.cmd.Process.Pid)
		if err != nil {
			return g, err
		}
		n := seq.Load() - seq0
		g.anonPerResource, g.anonResources = float64(m["RssAnon"]-anon0)*1024/float64(n), n
		g.memory = fmt.Sprintf("gateway process after %d fresh resources since the warm-up: anonymous memory grew by %.0f MiB (%.0f B per resource)",
			n, float64(m["RssAnon"]-anon0)/1024, g.anonPerResource)
	}
	if locksBin != "" {
		r, err := runEtcdLocks(ctx, etcdBin, locksBin, o.acquirers, o.duration, o.warmup)
		if err != nil {
			g.etcdErr = err
		} else {
			g.etcd = &r
		}
	}
	return g, nil
}

// memoryReport describes the gateway process's memory after grants on
// fresh resources (/proc/PID/status; bbolt's file is mapped, so it shows
// as RssFile) and the store file's size.
func memoryReport(p *peer, grants int) (report string, anonPerResource float64) {
	kb, err := bench.ReadMemory(p.cmd.Process.Pid)
	if err != nil {
		return "gateway memory: " + err.Error(), 0
	}
	var file int64
	if fi, err := os.Stat(filepath.Join(p.dir, "fencegw.db")); err == nil {
		file = fi.Size()
	}
	mib := func(k int64) string { return strconv.FormatFloat(float64(k)/1024, 'f', 0, 64) + " MiB" }
	per := ""
	if grants > 0 {
		anonPerResource = float64(kb["RssAnon"]) * 1024 / float64(grants)
		per = fmt.Sprintf(" (%.0f B anonymous per resource granted, the process's fixed part included)", anonPerResource)
	}
	return fmt.Sprintf("gateway process after %d grants on fresh resources: RSS %s (anonymous %s, file-mapped %s), peak %s; store file %s%s",
		grants, mib(kb["VmRSS"]), mib(kb["RssAnon"]), mib(kb["RssFile"]), mib(kb["VmHWM"]), mib(file/1024), per), anonPerResource
}
