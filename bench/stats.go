package bench

// Latency summaries and timed concurrent runs for the benchmarks.

import (
	"context"
	"runtime/pprof"
	"slices"
	"sync"
	"time"
)

// Summary describes the latencies of a run.
type Summary struct {
	N                        int
	Mean, P50, P90, P99, Max time.Duration
}

// Summarize sorts lat in place and returns its percentiles (nearest rank).
func Summarize(lat []time.Duration) Summary {
	if len(lat) == 0 {
		return Summary{}
	}
	slices.Sort(lat)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(lat))+0.999999) - 1
		return lat[min(max(i, 0), len(lat)-1)]
	}
	var sum time.Duration
	for _, l := range lat {
		sum += l
	}
	return Summary{N: len(lat), Mean: sum / time.Duration(len(lat)), P50: rank(0.50), P90: rank(0.90), P99: rank(0.99), Max: lat[len(lat)-1]}
}

// Recorder collects per-request latencies from many goroutines. Each
// goroutine records into its own slice and hands it over once, so recording
// takes no lock.
type Recorder struct {
	mu  sync.Mutex
	all []time.Duration
}

// Add hands over one goroutine's latencies.
func (r *Recorder) Add(lat []time.Duration) {
	r.mu.Lock()
	r.all = append(r.all, lat...)
	r.mu.Unlock()
}

// Summary summarises everything handed over so far.
func (r *Recorder) Summary() Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Summarize(r.all)
}

// Result is one timed run of a setup.
type Result struct {
	Name     string
	Requests int // answered as expected
	Errors   int
	FirstErr error
	Elapsed  time.Duration
	Latency  Summary
	// Samples are the latencies of the successful calls, sorted.
	Samples []time.Duration
}

// PerSecond is the throughput of successful requests.
func (r Result) PerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// RunFor calls op from conc workers until d has passed (or ctx ends) and
// measures each call. op gets the worker number and that worker's call
// number; a failed call is counted and not timed. The workers (and the
// client connections they dial) are labelled client=name in CPU profiles.
func RunFor(ctx context.Context, name string, d time.Duration, conc int, op func(ctx context.Context, worker, i int) error) Result {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := time.Now().Add(d)
	var (
		rec      Recorder
		mu       sync.Mutex
		errs     int
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	for w := range conc {
		wg.Go(func() {
			pprof.Do(ctx, pprof.Labels("client", name), func(ctx context.Context) {
				lat := make([]time.Duration, 0, 4096)
				for i := 0; ; i++ {
					t0 := time.Now()
					if !t0.Before(deadline) || ctx.Err() != nil {
						break
					}
					err := op(ctx, w, i)
					if err != nil {
						if ctx.Err() != nil {
							break
						}
						mu.Lock()
						errs++
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						continue
					}
					lat = append(lat, time.Since(t0))
				}
				rec.Add(lat)
			})
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	s := rec.Summary()
	return Result{Name: name, Requests: s.N, Errors: errs, FirstErr: firstErr, Elapsed: elapsed, Latency: s, Samples: rec.all}
}
