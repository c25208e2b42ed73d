package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fencegw/fencegw/bench"
)

func runWrites(ctx context.Context, o options, out io.Writer) error {
	e, err := start(ctx, o, o.concurrency, o.setups)
	if err != nil {
		return err
	}
	defer e.close()

	// Leases outlive the run: warm-up and measurement of every setup.
	ttl := min(time.Hour, time.Duration(len(o.setups))*(o.duration+o.warmup)+time.Minute)
	prefix := "fencegw-load:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var setups []string
	for _, s := range o.setups {
		switch s {
		case "gateway", "gateway-spread", "gateway-postgres", "gateway-postgres-spread":
			n := 1
			if strings.HasSuffix(s, "-spread") {
				n = o.resources
			}
			gw := e.gateway
			if strings.HasPrefix(s, "gateway-postgres") {
				gw = e.gatewayPG
			}
			ids, err := bench.AcquireMany(ctx, e.client, gw, prefix+":"+s, n, 64, ttl)
			if err != nil {
				return fmt.Errorf("acquire leases for %s: %w", s, err)
			}
			e.leases = append(e.leases, ids...)
			e.targets[s] = bench.GatewayTarget(s, gw, e.upstream, ids)
		}
		if _, ok := e.targets[s]; ok {
			setups = append(setups, s)
		}
	}
	if len(setups) == 0 {
		return errors.New("no setup to drive")
	}

	body := bytes.Repeat([]byte("x"), o.bodySize)
	op := func(t bench.Target) func(ctx context.Context, _, _ int) error {
		return func(ctx context.Context, _, _ int) error {
			_, err := bench.Write(ctx, e.client, t, body, rand.IntN(1<<30))
			return err
		}
	}
	proto := "HTTP/1.1"
	if o.tls {
		proto = "HTTPS (TLS to the proxies, HTTP/1.1)"
	}
	fmt.Fprintf(out, "fencegw-load: %d writers, %d B bodies, %s, %s per setup in %d rounds, GOMAXPROCS=%d (the load generator shares the CPUs with the servers)\n",
		o.concurrency, o.bodySize, proto, o.duration, o.rounds, runtime.GOMAXPROCS(0))
	for _, s := range setups {
		if o.warmup > 0 {
			r := bench.RunFor(ctx, s, o.warmup, o.concurrency, op(e.targets[s]))
			if r.Errors > 0 {
				return fmt.Errorf("%s: warm-up: %d writes failed; first: %w", s, r.Errors, r.FirstErr)
			}
		}
	}
	var delivered int64
	if e.local != nil {
		delivered = e.local.Requests.Load()
	}
	stopProfiles := func() error { return nil }
	if o.servers == "inline" || o.gateway != "" {
		if stopProfiles, err = startProfiles(o); err != nil {
			return err
		}
	}
	results := make(map[string]*merged, len(setups))
	for round := range o.rounds {
		for _, s := range rotate(setups, round) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			p := e.peers[strings.TrimSuffix(s, "-spread")] // a spread setup is its gateway's
			self0, peer0 := bench.SelfCPU(), time.Duration(0)
			if p != nil {
				peer0 = p.cpu()
			}
			r := bench.RunFor(ctx, s, o.duration/time.Duration(o.rounds), o.concurrency, op(e.targets[s]))
			if results[s] == nil {
				results[s] = &merged{}
			}
			results[s].add(r)
			results[s].selfCPU += bench.SelfCPU() - self0
			if p != nil {
				results[s].peerCPU += p.cpu() - peer0
			}
		}
	}
	if err := stopProfiles(); err != nil {
		return err
	}
	if e.local != nil {
		var sent int64
		for s, m := range results {
			if s != "net-http" { // answers itself
				sent += int64(m.requests)
			}
		}
		if got := e.local.Requests.Load() - delivered; got != sent {
			return fmt.Errorf("the upstream received %d writes, the clients saw %d answered: the setup is broken", got, sent)
		}
		if e.local.Leaked.Load() != 0 {
			return errors.New("writes reached the upstream with the Fencing-Lease secret")
		}
	}
	printWrites(out, setups, results)
	for _, s := range setups {
		if m := results[s]; m.errors > 0 {
			return fmt.Errorf("%s: %d writes failed; first: %w", s, m.errors, m.firstErr)
		}
	}
	return nil
}

// rotate starts round r at a different setup, so no setup always runs first.
func rotate(s []string, r int) []string {
	k := r % len(s)
	return append(append([]string{}, s[k:]...), s[:k]...)
}

// merged accumulates one setup's rounds, keeping every latency.
type merged struct {
	requests, errors int
	firstErr         error
	elapsed          time.Duration
	samples          []time.Duration
	// selfCPU is this process's CPU time during the setup's slices
	// (clients, upstream, in-process servers); peerCPU, the peer
	// proxy's processes'.
	selfCPU, peerCPU time.Duration
}

// perRequest is d per answered request, in µs.
func (m *merged) perRequest(d time.Duration) float64 {
	if m.requests == 0 {
		return 0
	}
	return float64(d) / 1e3 / float64(m.requests)
}

func (m *merged) add(r bench.Result) {
	m.requests += r.Requests
	m.errors += r.Errors
	m.elapsed += r.Elapsed
	m.samples = append(m.samples, r.Samples...)
	if m.firstErr == nil {
		m.firstErr = r.FirstErr
	}
}

func us(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 0, 64) }

// printWrites prints one row per setup, then each setup's ratios to the
// bare proxy and to nginx. CPU per request: "all" is this process's CPU
// (clients, upstream, in-process servers) plus a peer's own; "server" is
// a peer's own, or for an in-process server this process's per request
// minus the direct setup's (what the clients and the upstream cost).
func printWrites(out io.Writer, setups []string, results map[string]*merged) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "setup\trequests\terrors\treq/s\tp50 µs\tp90 µs\tp99 µs\tmax µs\tCPU µs/req all\tserver\t")
	sums := map[string]bench.Summary{}
	rates := map[string]float64{}
	server := map[string]float64{}
	var direct float64
	if m, ok := results["direct"]; ok {
		direct = m.perRequest(m.selfCPU)
	}
	for _, s := range setups {
		m := results[s]
		sum := bench.Summarize(m.samples)
		sums[s] = sum
		rates[s] = float64(m.requests) / m.elapsed.Seconds()
		cpu := "-"
		switch {
		case m.peerCPU > 0:
			server[s] = m.perRequest(m.peerCPU)
		case s != "direct" && direct > 0:
			server[s] = m.perRequest(m.selfCPU) - direct
		}
		if v, ok := server[s]; ok {
			cpu = strconv.FormatFloat(v, 'f', 1, 64)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%.1f\t%s\t\n", s, m.requests, m.errors, rates[s], us(sum.P50), us(sum.P90), us(sum.P99), us(sum.Max),
			m.perRequest(m.selfCPU+m.peerCPU), cpu)
	}
	_ = tw.Flush()
	for _, ref := range []string{"bare-proxy", "nginx"} {
		if _, ok := sums[ref]; !ok {
			continue
		}
		for _, s := range setups {
			if s == ref || s == "direct" {
				continue
			}
			line := fmt.Sprintf("%s / %s: throughput %.2f, p50 %+.0f µs, p99 %+.0f µs", s, ref,
				rates[s]/rates[ref], float64(sums[s].P50-sums[ref].P50)/1e3, float64(sums[s].P99-sums[ref].P99)/1e3)
			if server[s] > 0 && server[ref] > 0 {
				line += fmt.Sprintf(", server CPU per request %.2f", server[s]/server[ref])
			}
			fmt.Fprintln(out, line)
		}
	}
	// The PostgreSQL mode against the embedded one, on 1 and on many
	// resources.
	for _, pair := range [][2]string{{"gateway-postgres", "gateway"}, {"gateway-postgres-spread", "gateway-spread"}} {
		s, ref := pair[0], pair[1]
		if _, ok := sums[s]; !ok {
			continue
		}
		if _, ok := sums[ref]; !ok {
			continue
		}
		p50 := 100 * (float64(sums[s].P50)/float64(sums[ref].P50) - 1)
		fmt.Fprintf(out, "%s / %s: throughput %.2f, p50 %+.0f %%\n", s, ref, rates[s]/rates[ref], p50)
	}
}
