package main

// The writes run: every setup driven in alternating rounds, and the table
// of what each measured.

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
	setups, results, err := measureWrites(ctx, o, out)
	if err != nil {
		return err
	}
	printWrites(out, setups, results)
	for _, s := range setups {
		if m := results[s]; m.errors > 0 {
			return fmt.Errorf("%s: %d writes failed; first: %w", s, m.errors, m.firstErr)
		}
	}
	return nil
}

// measureWrites drives o.setups in alternating rounds and returns, for each
// setup driven, what its rounds measured.
func measureWrites(ctx context.Context, o options, out io.Writer) ([]string, map[string]*merged, error) {
	e, err := start(ctx, o, o.concurrency, o.setups)
	if err != nil {
		return nil, nil, err
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
				return nil, nil, fmt.Errorf("acquire leases for %s: %w", s, err)
			}
			e.leases = append(e.leases, ids...)
			e.targets[s] = bench.GatewayTarget(s, gw, e.upstream, ids)
		}
		if _, ok := e.targets[s]; ok {
			setups = append(setups, s)
		}
	}
	if len(setups) == 0 {
		return nil, nil, errors.New("no setup to drive")
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
				return nil, nil, fmt.Errorf("%s: warm-up: %d writes failed; first: %w", s, r.Errors, r.FirstErr)
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
			return nil, nil, err
		}
	}
	results := make(map[string]*merged, len(setups))
	for round := range o.rounds {
		for _, s := range rotate(setups, round) {
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
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
			var peerCPU time.Duration
			if p != nil {
				peerCPU = p.cpu() - peer0
				results[s].peerCPU += peerCPU
			}
			results[s].rounds = append(results[s].rounds, slice{requests: r.Requests, peerCPU: peerCPU})
		}
	}
	if err := stopProfiles(); err != nil {
		return nil, nil, err
	}
	if e.local != nil {
		var sent int64
		for s, m := range results {
			if s != "net-http" { // answers itself
				sent += int64(m.requests)
			}
		}
		if got := e.local.Requests.Load() - delivered; got != sent {
			return nil, nil, fmt.Errorf("the upstream received %d writes, the clients saw %d answered: the setup is broken", got, sent)
		}
		if e.local.Leaked.Load() != 0 {
			return nil, nil, errors.New("writes reached the upstream with the Fencing-Lease secret")
		}
	}
	return setups, results, nil
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
	// rounds are the setup's slices one by one, in the rounds' order.
	rounds []slice
}

// slice is one round's slice of a setup: its answered requests and its
// peer's CPU time (0 for an in-process server).
type slice struct {
	requests int
	peerCPU  time.Duration
}

// roundRatios are a's server CPU per request ÷ b's, round by round (each
// round drives every setup once, one after another): how far one run's
// quotient of the whole moves from slice to slice. Nil unless both ran in
// processes of their own for the same rounds.
func roundRatios(a, b *merged) []float64 {
	if a == nil || b == nil || len(a.rounds) != len(b.rounds) {
		return nil
	}
	var out []float64
	for i := range a.rounds {
		x, y := a.rounds[i], b.rounds[i]
		if x.requests == 0 || y.requests == 0 || x.peerCPU <= 0 || y.peerCPU <= 0 {
			return nil
		}
		out = append(out, float64(x.peerCPU)/float64(x.requests)/(float64(y.peerCPU)/float64(y.requests)))
	}
	return out
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
	rows := writeRows(setups, results)
	bySetup := map[string]writeRow{}
	for _, r := range rows {
		bySetup[r.setup] = r
		cpu := "-"
		if r.server > 0 {
			cpu = strconv.FormatFloat(r.server, 'f', 1, 64)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%.1f\t%s\t\n", r.setup, r.requests, r.errors, r.rate, us(r.sum.P50), us(r.sum.P90), us(r.sum.P99), us(r.sum.Max),
			r.all, cpu)
	}
	_ = tw.Flush()
	for _, ref := range []string{"bare-proxy", "nginx"} {
		rr, ok := bySetup[ref]
		if !ok {
			continue
		}
		for _, r := range rows {
			if r.setup == ref || r.setup == "direct" {
				continue
			}
			line := fmt.Sprintf("%s / %s: throughput %.2f, p50 %+.0f µs, p99 %+.0f µs", r.setup, ref,
				r.rate/rr.rate, float64(r.sum.P50-rr.sum.P50)/1e3, float64(r.sum.P99-rr.sum.P99)/1e3)
			if r.server > 0 && rr.server > 0 {
				line += fmt.Sprintf(", server CPU per request %.2f", r.server/rr.server)
			}
			fmt.Fprintln(out, line)
		}
	}
	// The PostgreSQL mode against the embedded one, on 1 and on many
	// resources.
	for _, pair := range [][2]string{{"gateway-postgres", "gateway"}, {"gateway-postgres-spread", "gateway-spread"}} {
		r, ok1 := bySetup[pair[0]]
		rr, ok2 := bySetup[pair[1]]
		if !ok1 || !ok2 {
			continue
		}
		p50 := 100 * (float64(r.sum.P50)/float64(rr.sum.P50) - 1)
		fmt.Fprintf(out, "%s / %s: throughput %.2f, p50 %+.0f %%\n", r.setup, rr.setup, r.rate/rr.rate, p50)
	}
}

// writeRow is one setup's measurement. CPU per request, in µs: all is this
// process's CPU (clients, upstream, in-process servers) plus a peer's own;
// server is a peer's own, or for an in-process server this process's per
// request minus the direct setup's (what the clients and the upstream
// cost); 0 where unknown.
type writeRow struct {
	setup            string
	requests, errors int
	rate             float64 // req/s
	sum              bench.Summary
	all, server      float64
}

func writeRows(setups []string, results map[string]*merged) []writeRow {
	var direct float64
	if m, ok := results["direct"]; ok {
		direct = m.perRequest(m.selfCPU)
	}
	rows := make([]writeRow, 0, len(setups))
	for _, s := range setups {
		m := results[s]
		r := writeRow{setup: s, requests: m.requests, errors: m.errors, rate: float64(m.requests) / m.elapsed.Seconds(),
			sum: bench.Summarize(m.samples), all: m.perRequest(m.selfCPU + m.peerCPU)}
		switch {
		case m.peerCPU > 0:
			r.server = m.perRequest(m.peerCPU)
		case s != "direct" && direct > 0:
			r.server = m.perRequest(m.selfCPU) - direct
		}
		rows = append(rows, r)
	}
	return rows
}
