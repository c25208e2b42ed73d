package bolt

import (
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// BenchmarkGrantParallel measures durable grants on distinct resources with
// 32 goroutines per CPU (64 on a 2-core machine): group commit lets them
// share fsyncs.
func BenchmarkGrantParallel(b *testing.B) {
	s := openAt(b, filepath.Join(b.TempDir(), "fencegw.db"), Options{})
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(32)
	b.ReportAllocs()
	tx0 := lastCommit(b, s)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resource := "bench/" + strconv.FormatInt(n.Add(1), 10)
			if _, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: "bench", TTL: time.Minute}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
	b.ReportMetric(float64(b.N)/float64(lastCommit(b, s)-tx0), "grants/commit")
}

// BenchmarkGrantBatch is a grant's work in the store with batches made
// alike every time: each op is one commit of 32 grants of fresh resources
// named as fencegw-load -grants names them (counting up), all queued
// behind a call that holds the committer until they are. Its allocs/op
// and, under callgrind (GOGC=off GODEBUG=asyncpreemptoff=1), its
// instruction count repeat from run to run, unlike a parallel run's
// batches; ns/op is the commit's fsyncs and the wait for the batch to
// queue, nothing to compare. The committer is idle between ops, so each
// op starts one afresh, whose stack then grows through bbolt's commit
// (about a fifth of the instructions): under a steady load it stays.
func BenchmarkGrantBatch(b *testing.B) {
	const batch = 32
	s := openAt(b, filepath.Join(b.TempDir(), "fencegw.db"), Options{})
	ctx := context.Background()
	seq := 0
	b.ReportAllocs()
	for b.Loop() {
		release, plugged := make(chan struct{}), make(chan struct{})
		go func() {
			_ = s.group.do(ctx, func(*bbolt.Tx) error { close(plugged); <-release; return nil })
		}()
		<-plugged
		var wg sync.WaitGroup
		for range batch {
			seq++
			req := tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "fencegw-load:grant:bench:" + strconv.Itoa(seq),
				Holder: "fencegw-load", TTL: time.Second}
			wg.Go(func() {
				if _, err := s.Grant(ctx, req); err != nil {
					b.Error(err)
				}
			})
		}
		for !s.group.pendingAtLeast(batch) {
			// Not a spin, nor short sleeps: under callgrind their count, which
			// follows the disk's latency, would be in the instructions.
			time.Sleep(time.Millisecond)
		}
		close(release)
		wg.Wait()
	}
}

// BenchmarkGrantCappedParallel is BenchmarkGrantParallel with an owner
// under a cap (tokens.GrantRequest.MaxLeases) on every grant: the owner
// index's entry and the count in the grant's transaction. Eight owners,
// each under a cap that its grants never reach.
func BenchmarkGrantCappedParallel(b *testing.B) {
	s := openAt(b, filepath.Join(b.TempDir(), "fencegw.db"), Options{})
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			req := tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "bench/" + strconv.FormatInt(i, 10), Holder: "bench",
				Owner: "owner-" + strconv.FormatInt(i%8, 10), MaxLeases: 1 << 30, TTL: time.Millisecond}
			if _, err := s.Grant(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
}

// lastCommit is the id of s's last committed write transaction.
func lastCommit(b *testing.B, s *Store) int {
	var id int
	if err := s.db.View(func(tx *bbolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		b.Fatal(err)
	}
	return id
}

// BenchmarkRecordRejectionParallel measures a rejection storm.
func BenchmarkRecordRejectionParallel(b *testing.B) {
	s := openAt(b, filepath.Join(b.TempDir(), "fencegw.db"), Options{})
	ctx := context.Background()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.RecordRejection(ctx, tokens.Rejection{Resource: "storm", Code: tokens.CodeStaleToken, Method: "PUT", Path: "/x"}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rejections/s")
}

func benchLeases(b *testing.B) (*Store, []tokens.Lease) {
	s := openAt(b, filepath.Join(b.TempDir(), "fencegw.db"), Options{})
	ctx := context.Background()
	leases := make([]tokens.Lease, 1024)
	for i := range leases {
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r" + strconv.Itoa(i), Holder: "bench", TTL: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		leases[i] = l
	}
	return s, leases
}

// BenchmarkLeaseLookup measures the cached read path of every fenced write.
func BenchmarkLeaseLookup(b *testing.B) {
	s, leases := benchLeases(b)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := s.Lease(ctx, leases[i&1023].ID); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkResourceLookup measures the other cached read of a fenced write.
func BenchmarkResourceLookup(b *testing.B) {
	s, leases := benchLeases(b)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := s.Resource(ctx, leases[i&1023].Resource); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkLeaseLookupParallel is BenchmarkLeaseLookup from every CPU.
func BenchmarkLeaseLookupParallel(b *testing.B) {
	s, leases := benchLeases(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := s.Lease(ctx, leases[i&1023].ID); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkKeyedWrite is the store's part of one keyed write: BeginKey then
// FinishKey, serially (each a commit and its fsyncs) and from 64 goroutines
// (the changes share commits).
func BenchmarkKeyedWrite(b *testing.B) {
	for _, par := range []int{0, 32} {
		name := "serial"
		if par > 0 {
			name = "parallel-" + strconv.Itoa(par) + "xCPU"
		}
		b.Run(name, func(b *testing.B) {
			s := openAt(b, filepath.Join(b.TempDir(), "fencegw.db"), Options{})
			ctx := context.Background()
			var n atomic.Int64
			one := func() error {
				sc := tokens.KeyScope{Resource: "bench", Upstream: "u", Key: strconv.FormatInt(n.Add(1), 10)}
				if _, _, err := s.BeginKey(ctx, tokens.KeyBegin{Scope: sc, Attempt: "a", Fingerprint: "f", InFlight: time.Minute, Window: time.Hour}); err != nil {
					return err
				}
				return s.FinishKey(ctx, sc, "a", tokens.KeyOutcome{State: tokens.KeyCompleted, Status: 200, Body: []byte(`{"ok":true}`), Window: time.Hour})
			}
			before := s.KeyCommits()
			b.ResetTimer()
			if par == 0 {
				for range b.N {
					if err := one(); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := one(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
			b.ReportMetric(float64(s.KeyCommits()-before)/float64(b.N), "commits/write")
		})
	}
}
