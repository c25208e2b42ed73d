package main

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
	var etcdBin, locksBin string
	if o.etcdLocks != "" {
		var err error
		if etcdBin, locksBin, err = lookEtcd(o.etcd, o.etcdLocks); err != nil {
			return err
		}
	}
	e, err := start(ctx, o, o.acquirers, nil)
	if err != nil {
		return err
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
	// The gateway's own CPU per grant (its process, with -servers process):
	// on a shared machine, or a slow disk, grants/s says more about the
	// neighbours and the fsyncs than about the gateway.
	gw := e.peers["gateway"]
	var cpu0 time.Duration
	if gw != nil {
		cpu0 = gw.cpu()
	}
	r := bench.RunFor(ctx, "grants", o.duration, o.acquirers, op)
	cpu := "-"
	if gw != nil && r.Requests > 0 {
		cpu = strconv.FormatFloat(float64(gw.cpu()-cpu0)/float64(time.Microsecond)/float64(r.Requests), 'f', 1, 64)
	}
	var etcd etcdResult
	var etcdErr error
	if locksBin != "" {
		etcd, etcdErr = runEtcdLocks(ctx, etcdBin, locksBin, o.acquirers, o.duration, o.warmup)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "setup\tgrants\terrors\tgrants/s\tp50 µs\tp90 µs\tp99 µs\tmax µs\tserver CPU µs/grant\t")
	fmt.Fprintf(tw, "gateway\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", r.Requests, r.Errors, r.PerSecond(), us(r.Latency.P50), us(r.Latency.P90), us(r.Latency.P99), us(r.Latency.Max), cpu)
	if locksBin != "" && etcdErr == nil {
		f := func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
		fmt.Fprintf(tw, "etcd (LeaseGrant + put-if-absent)\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%.1f\t\n", etcd.Acquisitions, etcd.Errors, etcd.PerSecond,
			f(etcd.P50US), f(etcd.P90US), f(etcd.P99US), f(etcd.MaxUS), float64(etcd.ServerCPU)/float64(time.Microsecond))
	}
	_ = tw.Flush()
	if locksBin != "" && etcdErr == nil && etcd.PerSecond > 0 {
		fmt.Fprintf(out, "grants ÷ etcd acquisitions: %.2f×\n", r.PerSecond()/etcd.PerSecond)
	}
	if p := e.peers["gateway"]; p != nil {
		fmt.Fprintln(out, memoryReport(p, r.Requests))
	}
	if r.Errors > 0 {
		return fmt.Errorf("%d grants failed; first: %w", r.Errors, r.FirstErr)
	}
	return etcdErr
}

// memoryReport describes the gateway process's memory after grants on
// fresh resources (/proc/PID/status; bbolt's file is mapped, so it shows
// as RssFile) and the store file's size.
func memoryReport(p *peer, grants int) string {
	kb, err := bench.ReadMemory(p.cmd.Process.Pid)
	if err != nil {
		return "gateway memory: " + err.Error()
	}
	var file int64
	if fi, err := os.Stat(filepath.Join(p.dir, "fencegw.db")); err == nil {
		file = fi.Size()
	}
	mib := func(k int64) string { return strconv.FormatFloat(float64(k)/1024, 'f', 0, 64) + " MiB" }
	per := ""
	if grants > 0 {
		per = fmt.Sprintf(" (%.0f B anonymous per resource granted)", float64(kb["RssAnon"])*1024/float64(grants))
	}
	return fmt.Sprintf("gateway process after %d grants on fresh resources: RSS %s (anonymous %s, file-mapped %s), peak %s; store file %s%s",
		grants, mib(kb["VmRSS"]), mib(kb["RssAnon"]), mib(kb["RssFile"]), mib(kb["VmHWM"]), mib(file/1024), per)
}
