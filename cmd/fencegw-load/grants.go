package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/fencegw/fencegw/bench"
)

func runGrants(ctx context.Context, o options, out io.Writer) error {
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
	// The anonymous memory halfway through, to tell what each resource
	// costs from what the process holds anyway (the store's bounded
	// cache, the heap's headroom): the quotient of the whole by the grants
	// falls as a run grows longer, the growth per resource does not.
	var mid anonSample
	midDone := make(chan struct{})
	go func() {
		defer close(midDone)
		select {
		case <-time.After(o.duration / 2):
			if gw != nil {
				mid = anonSample{grants: seq.Load(), kb: procStatus(gw)["RssAnon"]}
			}
		case <-ctx.Done():
		}
	}()
	r := bench.RunFor(ctx, "grants", o.duration, o.acquirers, op)
	<-midDone
	cpu := "-"
	if gw != nil && r.Requests > 0 {
		cpu = strconv.FormatFloat(float64(gw.cpu()-cpu0)/float64(time.Microsecond)/float64(r.Requests), 'f', 1, 64)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "setup\tgrants\terrors\tgrants/s\tp50 µs\tp90 µs\tp99 µs\tmax µs\tserver CPU µs/grant\t")
	fmt.Fprintf(tw, "gateway\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", r.Requests, r.Errors, r.PerSecond(), us(r.Latency.P50), us(r.Latency.P90), us(r.Latency.P99), us(r.Latency.Max), cpu)
	_ = tw.Flush()
	if p := e.peers["gateway"]; p != nil {
		fmt.Fprintln(out, memoryReport(p, r.Requests, mid, seq.Load()))
	}
	if r.Errors > 0 {
		return fmt.Errorf("%d grants failed; first: %w", r.Errors, r.FirstErr)
	}
	return nil
}

// anonSample is the gateway's anonymous memory (kB) after grants
// resources (warm-up included).
type anonSample struct {
	grants int64
	kb     int64
}

// procStatus reads p's /proc/PID/status figures in kB (nil if it cannot).
func procStatus(p *peer) map[string]int64 {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		return nil
	}
	kb := map[string]int64{}
	for _, line := range strings.Split(string(st), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			kb[k], _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	return kb
}

// memoryReport describes the gateway process's memory after grants on
// fresh resources (/proc/PID/status; bbolt's file is mapped, so it shows
// as RssFile) and the store file's size; with mid, the anonymous memory's
// growth per resource over the second half of the run (total: the
// resources granted, warm-up included).
func memoryReport(p *peer, grants int, mid anonSample, total int64) string {
	kb := procStatus(p)
	if kb == nil {
		return "gateway memory: /proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status unreadable"
	}
	var file int64
	if fi, err := os.Stat(filepath.Join(p.dir, "fencegw.db")); err == nil {
		file = fi.Size()
	}
	mib := func(k int64) string { return strconv.FormatFloat(float64(k)/1024, 'f', 0, 64) + " MiB" }
	per := ""
	if grants > 0 {
		per = fmt.Sprintf(" (%.0f B anonymous per resource granted, the process's fixed part included)", float64(kb["RssAnon"])*1024/float64(grants))
	}
	if mid.grants > 0 && total > mid.grants {
		per += fmt.Sprintf("; anonymous growth over the second half: %+.0f B per resource (%d KiB over %d grants)",
			float64(kb["RssAnon"]-mid.kb)*1024/float64(total-mid.grants), kb["RssAnon"]-mid.kb, total-mid.grants)
	}
	return fmt.Sprintf("gateway process after %d grants on fresh resources: RSS %s (anonymous %s, file-mapped %s), peak %s; store file %s%s",
		grants, mib(kb["VmRSS"]), mib(kb["RssAnon"]), mib(kb["RssFile"]), mib(kb["VmHWM"]), mib(file/1024), per)
}
