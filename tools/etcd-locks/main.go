// Command etcd-locks measures what a user would run instead of fencegw's
// grants: lock acquisitions on etcd, each a LeaseGrant and a put-if-absent
// of a fresh key under that lease (a transaction comparing the key's
// CreateRevision with 0), by concurrent acquirers for a fixed time. It
// prints one JSON object: acquisitions, errors, acquisitions per second and
// latency percentiles.
//
// It is a module of its own (like tools/fasthttp-ceiling), so that
// fencegw's module does not depend on etcd's client; cmd/fencegw-load
// starts etcd and runs this program beside its own grants (-grants -etcd).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

type result struct {
	Acquisitions int64   `json:"acquisitions"`
	Errors       int64   `json:"errors"`
	FirstError   string  `json:"first_error,omitempty"`
	PerSecond    float64 `json:"per_second"`
	P50US        float64 `json:"p50_us"`
	P90US        float64 `json:"p90_us"`
	P99US        float64 `json:"p99_us"`
	MaxUS        float64 `json:"max_us"`
}

func main() {
	endpoint := flag.String("endpoint", "127.0.0.1:2379", "etcd client endpoint")
	acquirers := flag.Int("acquirers", 64, "concurrent acquirers")
	duration := flag.Duration("duration", 20*time.Second, "measured time")
	warmup := flag.Duration("warmup", time.Second, "unmeasured warm-up")
	ttl := flag.Int64("ttl", 10, "lease TTL in seconds (etcd's minimum is 5)")
	prefix := flag.String("prefix", "fencegw-load/lock/", "key prefix; each acquisition takes a fresh key")
	flag.Parse()
	if err := run(*endpoint, *acquirers, *duration, *warmup, *ttl, *prefix); err != nil {
		fmt.Fprintln(os.Stderr, "etcd-locks: "+err.Error())
		os.Exit(1)
	}
}

func run(endpoint string, acquirers int, duration, warmup time.Duration, ttl int64, prefix string) error {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = cli.Status(ctx, endpoint)
	cancel()
	if err != nil {
		return fmt.Errorf("etcd at %s: %w", endpoint, err)
	}
	var seq atomic.Int64
	acquire := func(ctx context.Context) error {
		lease, err := cli.Grant(ctx, ttl)
		if err != nil {
			return fmt.Errorf("lease grant: %w", err)
		}
		key := prefix + strconv.FormatInt(seq.Add(1), 10)
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, "fencegw-load", clientv3.WithLease(lease.ID))).
			Commit()
		if err != nil {
			return fmt.Errorf("put-if-absent: %w", err)
		}
		if !resp.Succeeded {
			return errors.New("put-if-absent: the fresh key " + key + " exists")
		}
		return nil
	}
	if warmup > 0 {
		drive(acquirers, warmup, acquire)
	}
	r := drive(acquirers, duration, acquire)
	return json.NewEncoder(os.Stdout).Encode(r)
}

// drive runs acquire from n goroutines for d and summarises what it did.
func drive(n int, d time.Duration, acquire func(context.Context) error) result {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		mu       sync.Mutex
		all      []time.Duration
		errs     atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	start := time.Now()
	for range n {
		wg.Go(func() {
			var lat []time.Duration
			for ctx.Err() == nil {
				t0 := time.Now()
				if err := acquire(ctx); err != nil {
					if ctx.Err() != nil {
						break // cut off by the end of the run
					}
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(all)
	us := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		i := min(max(int(p*float64(len(all))+0.999999)-1, 0), len(all)-1)
		return float64(all[i]) / float64(time.Microsecond)
	}
	r := result{Acquisitions: int64(len(all)), Errors: errs.Load(), PerSecond: float64(len(all)) / elapsed.Seconds(),
		P50US: us(0.50), P90US: us(0.90), P99US: us(0.99), MaxUS: us(1)}
	if s, ok := firstErr.Load().(string); ok {
		r.FirstError = s
	}
	return r
}
