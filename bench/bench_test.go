package bench_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/bench"
)

var (
	clients   = flag.Int("bench.clients", 32, "concurrent clients in BenchmarkWrite")
	acquirers = flag.Int("bench.acquirers", 64, "concurrent acquirers in BenchmarkGrant")
	bodySize  = flag.Int("bench.body", 256, "write body size in bytes")
	spread    = flag.Int("bench.resources", 1000, "leases (one per resource) in BenchmarkWrite/gateway-spread")
)

// leaseTTL outlives any benchmark run.
const leaseTTL = time.Hour

// env is the three setups side by side, on one upstream.
type env struct {
	up      *bench.Upstream
	bare    *bench.Server
	gw      *bench.Gateway
	client  *http.Client
	body    []byte
	targets map[string]bench.Target
}

// newEnv starts the upstream, a bare proxy and a gateway (store in a fresh
// temporary directory), and takes one lease plus `resources` more through
// the gateway's API.
func newEnv(tb testing.TB, resources int) *env {
	tb.Helper()
	up, err := bench.StartUpstream()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = up.Close() })
	bare, err := bench.Serve(bench.NewBareProxy(up.URL))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = bare.Close() })
	gw, err := bench.StartGateway(tb.TempDir(), up.URL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := gw.Close(); err != nil {
			tb.Error(err)
		}
	})
	e := &env{up: up, bare: bare, gw: gw, client: bench.NewClient(max(*clients, *acquirers)), body: bytes.Repeat([]byte("x"), *bodySize)}
	tb.Cleanup(e.client.CloseIdleConnections)

	ctx := context.Background()
	one, err := bench.Acquire(ctx, e.client, gw.URL, "bench:one", "bench", leaseTTL)
	if err != nil {
		tb.Fatal(err)
	}
	e.targets = map[string]bench.Target{
		"direct":     bench.DirectTarget(up.URL),
		"bare-proxy": bench.BareProxyTarget(bare.URL),
		"gateway":    bench.GatewayTarget("gateway", gw.URL, bench.UpstreamName, []string{one}),
	}
	keyed := bench.GatewayTarget("gateway-keyed", gw.URL, bench.UpstreamName, []string{one})
	keyed.Keyed = true
	e.targets[keyed.Name] = keyed
	if resources > 0 {
		many, err := bench.AcquireMany(ctx, e.client, gw.URL, "bench:spread", resources, 64, leaseTTL)
		if err != nil {
			tb.Fatal(err)
		}
		name := "gateway-" + strconv.Itoa(resources) + "-resources"
		e.targets[name] = bench.GatewayTarget(name, gw.URL, bench.UpstreamName, many)
	}
	return e
}

// parallelism turns a number of goroutines into b.SetParallelism's unit.
func parallelism(goroutines int) int {
	return max(1, (goroutines+runtime.GOMAXPROCS(0)-1)/runtime.GOMAXPROCS(0))
}

// firstError keeps the first error reported from many goroutines.
type firstError struct {
	once sync.Once
	n    atomic.Int64
	err  error
}

func (f *firstError) add(err error) {
	f.n.Add(1)
	f.once.Do(func() { f.err = err })
}

// reportLatency reports throughput and latency percentiles as custom
// metrics; req/s is over the timed part of the run.
func reportLatency(b *testing.B, s bench.Summary, unit string) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit+"/s")
	b.ReportMetric(float64(s.P50)/float64(time.Microsecond), "p50-µs")
	b.ReportMetric(float64(s.P99)/float64(time.Microsecond), "p99-µs")
}

// benchWrites sends b.N writes to t from `clients` concurrent clients,
// then checks that each one reached the upstream exactly once (and, through
// a gateway, fenced and without the lease secret): a broken setup fails
// instead of producing fast numbers.
func benchWrites(b *testing.B, e *env, t bench.Target, clients int) {
	ctx := context.Background()
	before, fencedBefore, leakedBefore := e.up.Requests.Load(), e.up.Fenced.Load(), e.up.Leaked.Load()
	commitsBefore := e.gw.KeyCommits()
	var rec bench.Recorder
	var fail firstError
	write := func(lat []time.Duration) []time.Duration {
		t0 := time.Now()
		if _, err := bench.Write(ctx, e.client, t, e.body, rand.IntN(1<<30)); err != nil {
			fail.add(err)
			return lat
		}
		return append(lat, time.Since(t0))
	}
	b.SetBytes(int64(len(e.body)))
	b.ResetTimer()
	if clients == 1 {
		lat := make([]time.Duration, 0, b.N)
		for range b.N {
			lat = write(lat)
		}
		rec.Add(lat)
	} else {
		b.SetParallelism(parallelism(clients))
		b.RunParallel(func(pb *testing.PB) {
			lat := make([]time.Duration, 0, 1024)
			for pb.Next() {
				lat = write(lat)
			}
			rec.Add(lat)
		})
	}
	b.StopTimer()
	if fail.err != nil {
		b.Fatalf("%s: %d of %d writes failed; first: %v", t.Name, fail.n.Load(), b.N, fail.err)
	}
	if got := e.up.Requests.Load() - before; got != int64(b.N) {
		b.Fatalf("%s: upstream received %d writes, want %d", t.Name, got, b.N)
	}
	if leaked := e.up.Leaked.Load() - leakedBefore; leaked != 0 {
		b.Fatalf("%s: %d writes reached the upstream with the lease secret", t.Name, leaked)
	}
	fenced := e.up.Fenced.Load() - fencedBefore
	if want := int64(b.N) * int64(min(len(t.Leases), 1)); fenced != want {
		b.Fatalf("%s: %d writes carried %s, want %d", t.Name, fenced, "Fencing-Token", want)
	}
	reportLatency(b, rec.Summary(), "req")
	if t.Keyed {
		b.ReportMetric(float64(e.gw.KeyCommits()-commitsBefore)/float64(b.N), "key-commits/write")
	}
}

var writeSetups = []string{"direct", "bare-proxy", "gateway"}

// BenchmarkWrite sends the same POST to the same upstream directly, through
// a bare reverse proxy and through the gateway (one lease, then leases on
// -bench.resources resources picked at random), in one run.
func BenchmarkWrite(b *testing.B) {
	e := newEnv(b, *spread)
	names := slices.Concat(writeSetups, []string{"gateway-keyed", "gateway-" + strconv.Itoa(*spread) + "-resources"})
	for _, name := range names {
		b.Run(name, func(b *testing.B) { benchWrites(b, e, e.targets[name], *clients) })
	}
}

// BenchmarkWriteSerial is BenchmarkWrite with a single client, one write
// at a time: the latency each setup adds when the machine is not saturated,
// without queueing behind other clients.
func BenchmarkWriteSerial(b *testing.B) {
	e := newEnv(b, *spread)
	names := slices.Concat(writeSetups, []string{"gateway-keyed", "gateway-" + strconv.Itoa(*spread) + "-resources"})
	for _, name := range names {
		b.Run(name, func(b *testing.B) { benchWrites(b, e, e.targets[name], 1) })
	}
}

// BenchmarkGrant acquires leases on fresh resources through the gateway's
// HTTP API from -bench.acquirers goroutines; every grant is a durable bbolt
// commit shared with the grants batched with it.
func BenchmarkGrant(b *testing.B) {
	e := newEnv(b, 0)
	ctx := context.Background()
	var seq atomic.Int64
	var rec bench.Recorder
	var fail firstError
	run := time.Now().UnixNano()
	b.SetParallelism(parallelism(*acquirers))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		lat := make([]time.Duration, 0, 1024)
		for pb.Next() {
			resource := fmt.Sprintf("grant:%d:%d", run, seq.Add(1))
			t0 := time.Now()
			if _, err := bench.Acquire(ctx, e.client, e.gw.URL, resource, "bench", leaseTTL); err != nil {
				fail.add(err)
				continue
			}
			lat = append(lat, time.Since(t0))
		}
		rec.Add(lat)
	})
	b.StopTimer()
	if fail.err != nil {
		b.Fatalf("%d of %d grants failed; first: %v", fail.n.Load(), b.N, fail.err)
	}
	reportLatency(b, rec.Summary(), "grants")
}

// TestSetupsDeliver is the sanity check behind the benchmarks: each path
// delivers the write to the upstream once and relays the same answer, the
// gateway forwards with a token and without the lease secret, and it really
// fences (an unknown lease never reaches the upstream).
func TestSetupsDeliver(t *testing.T) {
	e := newEnv(t, 3)
	ctx := context.Background()
	var replies [][]byte
	for _, name := range slices.Concat(writeSetups, []string{"gateway-3-resources"}) {
		tg := e.targets[name]
		before, fenced := e.up.Requests.Load(), e.up.Fenced.Load()
		bytesBefore := e.up.Bytes.Load()
		for i := range 3 {
			reply, err := bench.Write(ctx, e.client, tg, e.body, i)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			replies = append(replies, reply)
		}
		if got := e.up.Requests.Load() - before; got != 3 {
			t.Errorf("%s: upstream received %d writes, want 3", name, got)
		}
		if got := e.up.Bytes.Load() - bytesBefore; got != 3*int64(len(e.body)) {
			t.Errorf("%s: upstream read %d body bytes, want %d", name, got, 3*len(e.body))
		}
		wantFenced := int64(0)
		if strings.HasPrefix(name, "gateway") {
			wantFenced = 3
		}
		if got := e.up.Fenced.Load() - fenced; got != wantFenced {
			t.Errorf("%s: %d writes carried Fencing-Token, want %d", name, got, wantFenced)
		}
	}
	for i, r := range replies {
		if !bytes.Equal(r, bench.UpstreamReply) {
			t.Errorf("reply %d = %q, want %q", i, r, bench.UpstreamReply)
		}
	}
	if n := e.up.Leaked.Load(); n != 0 {
		t.Errorf("%d writes reached the upstream with the lease secret", n)
	}

	before := e.up.Requests.Load()
	bogus := bench.GatewayTarget("gateway", e.gw.URL, bench.UpstreamName, []string{"fl_not_a_lease"})
	_, err := bench.Write(ctx, e.client, bogus, e.body, 0)
	var se *bench.StatusError
	if !errors.As(err, &se) || se.Status != http.StatusForbidden {
		t.Errorf("write with an unknown lease: err = %v, want status 403", err)
	}
	if e.up.Requests.Load() != before {
		t.Error("a write with an unknown lease reached the upstream")
	}
}

// TestReportRatios runs the write benchmarks and prints the ratios the
// targets are stated in. It measures, never asserts a speed; it runs only
// with FENCEGW_BENCH_REPORT=1 (with -v to see the output).
func TestReportRatios(t *testing.T) {
	if os.Getenv("FENCEGW_BENCH_REPORT") != "1" {
		t.Skip("set FENCEGW_BENCH_REPORT=1 to run the benchmarks and report ratios")
	}
	e := newEnv(t, *spread)
	results := map[string]testing.BenchmarkResult{}
	names := slices.Concat(writeSetups, []string{"gateway-" + strconv.Itoa(*spread) + "-resources"})
	for _, name := range names {
		results[name] = testing.Benchmark(func(b *testing.B) { benchWrites(b, e, e.targets[name], *clients) })
		r := results[name]
		if r.N == 0 {
			t.Fatalf("%s: benchmark failed", name)
		}
		t.Logf("%-28s %8d  %9.0f req/s  p50 %7.1f µs  p99 %7.1f µs", name, r.N, r.Extra["req/s"], r.Extra["p50-µs"], r.Extra["p99-µs"])
	}
	bare := results["bare-proxy"]
	for _, name := range names[2:] {
		g := results[name]
		t.Logf("%s / bare-proxy throughput: %.2f; added p50 %+.1f µs, p99 %+.1f µs",
			name, g.Extra["req/s"]/bare.Extra["req/s"], g.Extra["p50-µs"]-bare.Extra["p50-µs"], g.Extra["p99-µs"]-bare.Extra["p99-µs"])
	}
}

// BenchmarkRefusal compares what a refused stale write costs with a write
// that passes: through the bare proxy, through the gateway, and a stale
// write the gateway refuses with 409 (checked, recorded in the rejection
// log, published to the live feed, answered with a problem document). In a
// rejection storm every stale write is the last kind; this tells whether
// refusing is cheaper than forwarding.
func BenchmarkRefusal(b *testing.B) {
	e := newEnv(b, 0)
	ctx := context.Background()
	old, err := bench.Acquire(ctx, e.client, e.gw.URL, "bench:storm", "old", 100*time.Millisecond)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	if _, err := bench.Acquire(ctx, e.client, e.gw.URL, "bench:storm", "current", leaseTTL); err != nil {
		b.Fatal(err)
	}
	b.Run("bare-proxy", func(b *testing.B) { benchWrites(b, e, e.targets["bare-proxy"], *clients) })
	b.Run("gateway", func(b *testing.B) { benchWrites(b, e, e.targets["gateway"], *clients) })
	b.Run("gateway-stale", func(b *testing.B) {
		stale := bench.GatewayTarget("stale", e.gw.URL, bench.UpstreamName, []string{old})
		before := e.up.Requests.Load()
		var rec bench.Recorder
		var fail firstError
		b.SetParallelism(parallelism(*clients))
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			lat := make([]time.Duration, 0, 1024)
			for pb.Next() {
				t0 := time.Now()
				_, err := bench.Write(ctx, e.client, stale, e.body, 0)
				if se := (*bench.StatusError)(nil); !errors.As(err, &se) || se.Status != http.StatusConflict {
					fail.add(fmt.Errorf("stale write: want 409, got %v", err))
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			rec.Add(lat)
		})
		b.StopTimer()
		if fail.err != nil {
			b.Fatalf("%d of %d: %v", fail.n.Load(), b.N, fail.err)
		}
		if got := e.up.Requests.Load() - before; got != 0 {
			b.Fatalf("%d stale writes reached the upstream", got)
		}
		reportLatency(b, rec.Summary(), "req")
	})
}
