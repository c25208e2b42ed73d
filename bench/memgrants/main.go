// Command memgrants measures what the embedded store costs per resource:
// it grants n fresh resources once each from a number of concurrent
// acquirers against storage/bolt in this process, and reports grants/s, the
// Go heap and the process's RSS (VmRSS, and its anonymous and file-backed
// parts: the mapped bbolt file counts in RSS for the pages read through it)
// as it goes, then after a restart of the store. The target: a
// million resources below 300 MB RSS at 15,000 grants/s or more with 64
// acquirers.
//
//	go run ./bench/memgrants -n 1000000 -acquirers 64
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/bench"
	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

func main() {
	n := flag.Int("n", 1_000_000, "fresh resources to grant, once each")
	acquirers := flag.Int("acquirers", 64, "concurrent granting goroutines")
	ttl := flag.Duration("ttl", 30*time.Second, "lease TTL")
	cache := flag.Int("cache", 0, "bolt.Options.CacheEntries (0: the default)")
	dir := flag.String("dir", "", "directory for the store file (default: a temporary one, removed at the end)")
	every := flag.Int("every", 100_000, "report every this many grants")
	names := flag.String("names", "seq", "order of the resource names granted: seq (mem/1, mem/2, ...) or scattered (the same names in a scattered order, as random names would arrive)")
	flag.Parse()
	if *names != "seq" && *names != "scattered" {
		log.Fatalf("-names %q: want seq or scattered", *names)
	}
	if err := run(*n, *acquirers, *ttl, *cache, *dir, *every, *names == "scattered"); err != nil {
		log.Fatal(err)
	}
}

func run(n, acquirers int, ttl time.Duration, cacheEntries int, dir string, every int, scattered bool) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "memgrants-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	path := filepath.Join(dir, "fencegw.db")
	opts := bolt.Options{CacheEntries: cacheEntries, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	fmt.Printf("memgrants: n=%d acquirers=%d ttl=%v cache=%d scattered=%v GOMAXPROCS=%d file=%s\n", n, acquirers, ttl, cacheEntries, scattered, runtime.GOMAXPROCS(0), path)
	order := func(i int64) int64 { return i }
	if scattered {
		order = scatter(int64(n))
	}
	report("start", 0, 0, path)
	s, err := bolt.Open(path, opts)
	if err != nil {
		return err
	}
	ctx := context.Background()
	var next, done atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, acquirers)
	start := time.Now()
	lastAt, lastN := start, int64(0)
	stop := make(chan struct{})
	go func() { // progress
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if d := done.Load(); d-lastN >= int64(every) {
					now := time.Now()
					report("grants", d, float64(d-lastN)/now.Sub(lastAt).Seconds(), path)
					lastAt, lastN = now, d
				}
			}
		}
	}()
	for range acquirers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				_, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resourceName(order(i)), Holder: "memgrants", TTL: ttl})
				if err != nil {
					errc <- fmt.Errorf("grant %d: %w", i, err)
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	close(stop)
	elapsed := time.Since(start)
	select {
	case err := <-errc:
		return err
	default:
	}
	fmt.Printf("granted %d in %v: %.0f grants/s overall\n", n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
	report("end", int64(n), 0, path)
	// The read path on resources the cache mostly no longer holds.
	if err := sample(ctx, s, n, 10_000); err != nil {
		return err
	}
	report("after 10,000 random reads", int64(n), 0, path)
	if err := s.Close(); err != nil {
		return err
	}
	opened := time.Now()
	if s, err = bolt.Open(path, opts); err != nil {
		return err
	}
	fmt.Printf("reopened in %v\n", time.Since(opened).Round(time.Millisecond))
	report("reopened", int64(n), 0, path)
	if err := sample(ctx, s, n, 10_000); err != nil {
		return err
	}
	report("reopened + 10,000 random reads", int64(n), 0, path)
	if err := s.Close(); err != nil {
		return err
	}
	return fileStats(path, n)
}

// fileStats prints what each bucket of the file takes, per resource.
func fileStats(path string, n int) error {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bbolt.Tx) error {
		fmt.Printf("file: %d MB in use of %d pages of %d B\n", tx.Size()>>20, tx.Size()/int64(db.Info().PageSize), db.Info().PageSize)
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			st := b.Stats()
			pages := int64(st.BranchPageN+st.BranchOverflowN+st.LeafPageN+st.LeafOverflowN) * int64(db.Info().PageSize)
			inuse := int64(st.BranchInuse + st.LeafInuse)
			fmt.Printf("  %-24s keys=%-8d buckets=%-8d pages=%6.1f MB (%5.0f B/resource, %3.0f%% used)\n",
				name, st.KeyN, st.BucketN, float64(pages)/(1<<20), float64(pages)/float64(n), 100*float64(inuse)/float64(max(pages, 1)))
			return nil
		})
	})
}

func resourceName(i int64) string { return "mem/" + strconv.FormatInt(i, 10) }

// scatter returns a permutation of 1..n that visits the names in a
// scattered order (i -> (i-1)*a mod n + 1, a prime not dividing n), so that
// consecutive grants land far apart in the key order, as random names do,
// while the names and their lengths stay those of the seq order.
func scatter(n int64) func(int64) int64 {
	a := int64(2654435761) % n
	for a < 2 || gcd(a, n) != 1 {
		a++
	}
	return func(i int64) int64 { return (i-1)*a%n + 1 }
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// sample reads random resources and their leases, as a fenced write does.
func sample(ctx context.Context, s *bolt.Store, n, reads int) error {
	start := time.Now()
	for range reads {
		name := resourceName(rand.Int64N(int64(n)) + 1)
		r, err := s.Resource(ctx, name)
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		if r.Lease == nil || r.Token != 1 {
			return fmt.Errorf("read %s: %+v, want token 1 and its lease", name, r)
		}
		if _, err := s.Lease(ctx, r.Lease.ID); err != nil {
			return fmt.Errorf("lease of %s: %w", name, err)
		}
	}
	fmt.Printf("%d random Resource+Lease reads: %v each\n", reads, (time.Since(start) / time.Duration(reads)).Round(100*time.Nanosecond))
	return nil
}

// report prints the heap (after a GC), the RSS of this process and the
// store file's size.
func report(what string, grants int64, rate float64, path string) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st, _ := bench.ReadMemory(os.Getpid()) // zeros if unreadable
	var size int64
	if fi, err := os.Stat(path); err == nil {
		size = fi.Size()
	}
	line := fmt.Sprintf("%-32s grants=%-8d heap=%4d MB  VmRSS=%4d MB (anon %4d, file %4d)  VmHWM=%4d MB  file=%4d MB",
		what, grants, ms.HeapAlloc>>20, st["VmRSS"]>>10, st["RssAnon"]>>10, st["RssFile"]>>10, st["VmHWM"]>>10, size>>20)
	if rate > 0 {
		line += fmt.Sprintf("  %.0f grants/s", rate)
	}
	fmt.Println(line)
}
