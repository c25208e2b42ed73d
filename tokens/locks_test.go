package tokens

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLocalLockerExclusiveWaitsForShared(t *testing.T) {
	l := NewLocalLocker()
	ctx := context.Background()
	unlockR, err := l.Shared(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	got, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		unlock, err := l.Exclusive(ctx, "r")
		if err != nil {
			t.Error(err)
			return
		}
		close(got)
		unlock()
	}()
	select {
	case <-got:
		t.Fatal("exclusive lock taken while a shared one is held")
	case <-time.After(50 * time.Millisecond):
	}
	unlockR()
	unlockR() // a second call is harmless
	<-got
	<-finished
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) != 0 {
		t.Fatalf("entries left behind: %d", len(l.entries))
	}
}

// A waiting exclusive request blocks later shared ones, so a stream of
// writes cannot starve a grant.
func TestLocalLockerWriterPreference(t *testing.T) {
	l := NewLocalLocker()
	ctx := context.Background()
	unlockR, _ := l.Shared(ctx, "r")
	writerIn := make(chan func())
	go func() {
		u, _ := l.Exclusive(ctx, "r")
		writerIn <- u
	}()
	time.Sleep(20 * time.Millisecond) // let the writer queue
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := l.Shared(short, "r"); err == nil {
		t.Fatal("a new shared lock overtook a waiting exclusive one")
	}
	unlockR()
	(<-writerIn)()
	if u, err := l.Shared(ctx, "r"); err != nil {
		t.Fatal(err)
	} else {
		u()
	}
}

func TestLocalLockerTimeoutReleasesQueuedReaders(t *testing.T) {
	l := NewLocalLocker()
	ctx := context.Background()
	unlockR, _ := l.Shared(ctx, "r")
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := l.Exclusive(short, "r"); err == nil {
		t.Fatal("exclusive lock while shared held")
	}
	// The writer gave up: new readers must not stay blocked behind it.
	u, err := l.Shared(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	u()
	unlockR()
}

func TestLocalLockerMutualExclusion(t *testing.T) {
	l := NewLocalLocker()
	ctx := context.Background()
	var readers, writers atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if i%4 == 0 {
					u, _ := l.Exclusive(ctx, "r")
					if writers.Add(1) != 1 || readers.Load() != 0 {
						t.Error("exclusive lock not exclusive")
					}
					writers.Add(-1)
					u()
				} else {
					u, _ := l.Shared(ctx, "r")
					readers.Add(1)
					if writers.Load() != 0 {
						t.Error("shared lock held with an exclusive one")
					}
					readers.Add(-1)
					u()
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkLocalLockerShared(b *testing.B) {
	l := NewLocalLocker()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			u, _ := l.Shared(ctx, "hot")
			u()
		}
	})
}
