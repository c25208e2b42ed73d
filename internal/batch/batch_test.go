package batch

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// recorder is a Commit that records its batches and answers item*10. If
// gate is set, each commit first waits for a value from it.
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	gate    chan struct{}
	started chan struct{} // if set, gets a value as each commit starts
	err     error
}

func (r *recorder) commit(items []int, results []int) error {
	if r.started != nil {
		r.started <- struct{}{}
	}
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	r.batches = append(r.batches, slices.Clone(items))
	r.mu.Unlock()
	for i, it := range items {
		results[i] = it * 10
	}
	return r.err
}

func (r *recorder) sizes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for _, b := range r.batches {
		out = append(out, len(b))
	}
	return out
}

func (r *recorder) all() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for _, b := range r.batches {
		out = append(out, b...)
	}
	slices.Sort(out)
	return out
}

// queued waits until n items wait in b's queue.
func queued[T, R any](t *testing.T, b *Batcher[T, R], n int) {
	t.Helper()
	for len(b.queue) < n {
		select {
		case <-t.Context().Done():
			t.Fatalf("%d items never queued", n)
		default:
		}
		time.Sleep(time.Millisecond) // the senders are this test's goroutines
	}
}

// Every caller gets its own item's result, and every item is committed
// exactly once, with many callers at once.
func TestEveryItemCommittedOnceWithItsResult(t *testing.T) {
	rec := &recorder{}
	b := New(Options{Max: 7}, rec.commit)
	defer b.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for g := range 20 {
		wg.Go(func() {
			for i := range 50 {
				item := g*100 + i
				r, err := b.Do(t.Context(), item)
				if err != nil || r != item*10 {
					errs <- errors.New("wrong result")
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var want []int
	for g := range 20 {
		for i := range 50 {
			want = append(want, g*100+i)
		}
	}
	if got := rec.all(); !slices.Equal(got, want) {
		t.Fatalf("committed %d items, want each of %d once", len(got), len(want))
	}
	for _, n := range rec.sizes() {
		if n < 1 || n > 7 {
			t.Fatalf("a batch of %d; Max is 7", n)
		}
	}
}

// While a commit runs the next batch gathers: what queued meanwhile is one
// commit, cut at Max.
func TestBatchesGatherWhileACommitRuns(t *testing.T) {
	rec := &recorder{gate: make(chan struct{}), started: make(chan struct{}, 10)}
	b := New(Options{Max: 10, Queue: 100}, rec.commit)
	defer b.Close()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = b.Do(t.Context(), 0) })
	<-rec.started // the first commit holds the loop
	for i := 1; i <= 25; i++ {
		wg.Go(func() { _, _ = b.Do(t.Context(), i) })
	}
	queued(t, b, 25)
	for range 4 {
		rec.gate <- struct{}{}
	}
	wg.Wait()
	if got := rec.sizes(); !slices.Equal(got, []int{1, 10, 10, 5}) {
		t.Fatalf("batch sizes %v, want [1 10 10 5]", got)
	}
}

// A commit's error is the result of every item in its batch.
func TestErrorReachesEveryItemOfItsBatch(t *testing.T) {
	boom := errors.New("boom")
	rec := &recorder{err: boom}
	b := New(Options{Max: 4}, rec.commit)
	defer b.Close()
	if _, err := b.Do(t.Context(), 1); !errors.Is(err, boom) {
		t.Fatalf("Do: %v, want the commit's error", err)
	}
}

// Close commits what is queued (sent or waited for), answers the waiters,
// and refuses what comes after.
func TestCloseDrainsTheQueue(t *testing.T) {
	rec := &recorder{gate: make(chan struct{}), started: make(chan struct{}, 10)}
	b := New(Options{Max: 3, Queue: 100}, rec.commit)
	if !b.Send(0) {
		t.Fatal("Send refused with room in the queue")
	}
	<-rec.started // the loop is busy with item 0
	for i := 1; i <= 4; i++ {
		if !b.Send(i) {
			t.Fatal("Send refused with room in the queue")
		}
	}
	results := make(chan int, 3)
	for i := 5; i <= 7; i++ {
		go func() {
			r, err := b.Do(context.Background(), i)
			if err != nil {
				r = -1
			}
			results <- r
		}()
	}
	queued(t, b, 7)
	closed := make(chan struct{})
	go func() { b.Close(); close(closed) }()
	<-b.stop // Close began
	close(rec.gate)
	<-closed
	if got, want := rec.all(), []int{0, 1, 2, 3, 4, 5, 6, 7}; !slices.Equal(got, want) {
		t.Fatalf("committed %v, want %v", got, want)
	}
	var got []int
	for range 3 {
		got = append(got, <-results)
	}
	slices.Sort(got)
	if !slices.Equal(got, []int{50, 60, 70}) {
		t.Fatalf("waiters got %v, want their results", got)
	}
	if _, err := b.Do(t.Context(), 8); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close: %v, want ErrClosed", err)
	}
	if b.Send(9) {
		t.Fatal("Send after Close accepted")
	}
	b.Close() // idempotent
}

// A full queue: Send gives up at once, Do waits until its ctx ends.
func TestFullQueue(t *testing.T) {
	rec := &recorder{gate: make(chan struct{}), started: make(chan struct{}, 10)}
	b := New(Options{Max: 1, Queue: 2}, rec.commit)
	defer func() { close(rec.gate); b.Close() }()
	b.Send(0)
	<-rec.started
	b.Send(1)
	b.Send(2)
	if b.Send(3) {
		t.Fatal("Send accepted into a full queue")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := b.Do(ctx, 4); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do into a full queue with an ended ctx: %v", err)
	}
	// A Do into a full queue waits for room until its context ends: its
	// error is the deadline's, not a refusal of the full queue.
	ctx, cancel = context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := b.Do(ctx, 5); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do into a full queue: %v, want it to wait until its deadline", err)
	}
	if got := rec.all(); slices.Contains(got, 4) || slices.Contains(got, 5) {
		t.Fatalf("committed %v: a Do that gave up was committed", got)
	}
}

// A Do into a full queue that gets room before its context ends is
// committed like any other.
func TestFullQueueDoGetsRoom(t *testing.T) {
	rec := &recorder{gate: make(chan struct{}), started: make(chan struct{}, 10)}
	b := New(Options{Max: 1, Queue: 1}, rec.commit)
	defer b.Close()
	b.Send(0)
	<-rec.started
	b.Send(1) // the queue is full
	done := make(chan error, 1)
	go func() {
		_, err := b.Do(t.Context(), 2)
		done <- err
	}()
	close(rec.gate) // commits run: the queue gets room
	if err := <-done; err != nil {
		t.Fatalf("Do after the queue got room: %v", err)
	}
	if got := rec.all(); !slices.Contains(got, 2) {
		t.Fatalf("committed %v, want 2 among them", got)
	}
}

// ctx ends the wait for a result, not the commit.
func TestCtxEndsTheWaitNotTheCommit(t *testing.T) {
	rec := &recorder{gate: make(chan struct{}), started: make(chan struct{}, 10)}
	b := New(Options{Max: 1}, rec.commit)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := b.Do(ctx, 1)
		done <- err
	}()
	<-rec.started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do: %v, want context.Canceled", err)
	}
	close(rec.gate)
	b.Close()
	if got := rec.all(); !slices.Equal(got, []int{1}) {
		t.Fatalf("committed %v, want [1]", got)
	}
}
