package bolt

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/fencegw/fencegw/tokens"
)

var gcBucket = []byte("t")

func openGroupCommit(t *testing.T) (*bbolt.DB, *groupCommit) {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "gc.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket(gcBucket)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return db, newGroupCommit(db)
}

// lastTxID is the id of the last committed write transaction: the
// difference between two readings counts the commits in between.
func lastTxID(t *testing.T, db *bbolt.DB) int {
	t.Helper()
	var id int
	if err := db.View(func(tx *bbolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		t.Fatal(err)
	}
	return id
}

func put(key string) func(*bbolt.Tx) error {
	return func(tx *bbolt.Tx) error { return tx.Bucket(gcBucket).Put([]byte(key), []byte{1}) }
}

func keysPresent(t *testing.T, db *bbolt.DB, keys ...string) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	if err := db.View(func(tx *bbolt.Tx) error {
		for _, k := range keys {
			got[k] = tx.Bucket(gcBucket).Get([]byte(k)) != nil
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

func assertIdle(t *testing.T, g *groupCommit) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy || len(g.pending) > 0 {
		t.Fatalf("after the last call: busy %v, %d pending", g.busy, len(g.pending))
	}
}

// holdCommit starts a call whose transaction stays open until the returned
// function is called; that function then waits for the call's commit.
func holdCommit(t *testing.T, g *groupCommit) (release func()) {
	t.Helper()
	started, unblock := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	var once sync.Once
	go func() {
		done <- g.do(t.Context(), func(tx *bbolt.Tx) error {
			once.Do(func() { close(started); <-unblock })
			return put("held")(tx)
		})
	}()
	<-started
	return func() {
		close(unblock)
		if err := <-done; err != nil {
			t.Errorf("held call: %v", err)
		}
	}
}

// waitPending waits until n calls wait for the commit in flight. The
// deadline only turns a batcher that never queues them into a failure.
func waitPending(t *testing.T, g *groupCommit, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		g.mu.Lock()
		k := len(g.pending)
		g.mu.Unlock()
		if k >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d of %d calls queued behind the commit in flight", k, n)
			return
		}
	}
}

// runDuringCommit runs fns while another call's transaction is open, so
// that they all wait for the same next commit, and returns their errors.
func runDuringCommit(t *testing.T, g *groupCommit, fns ...func(*bbolt.Tx) error) []error {
	t.Helper()
	release := holdCommit(t, g)
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() { errs[i] = g.do(t.Context(), fn) })
	}
	waitPending(t, g, len(fns))
	release()
	wg.Wait()
	return errs
}

func TestGroupCommitLoneCallCommitsAtOnce(t *testing.T) {
	db, g := openGroupCommit(t)
	before := lastTxID(t, db)
	// Nothing else is pending or will be: a call that waited for company
	// would never return.
	if err := g.do(t.Context(), put("a")); err != nil {
		t.Fatal(err)
	}
	if n := lastTxID(t, db) - before; n != 1 {
		t.Errorf("a lone call took %d commits, want 1", n)
	}
	if !keysPresent(t, db, "a")["a"] {
		t.Error("lone call's write not committed")
	}
	assertIdle(t, g)
}

func TestGroupCommitCallsDuringACommitShareTheNext(t *testing.T) {
	db, g := openGroupCommit(t)
	before := lastTxID(t, db)
	var fns []func(*bbolt.Tx) error
	var keys []string
	for i := range 50 {
		keys = append(keys, fmt.Sprint("k", i))
		fns = append(fns, put(keys[i]))
	}
	for i, err := range runDuringCommit(t, g, fns...) {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if n := lastTxID(t, db) - before; n != 2 {
		t.Errorf("%d commits, want 2: the held call's, then one for the 50 that waited", n)
	}
	for k, ok := range keysPresent(t, db, keys...) {
		if !ok {
			t.Errorf("%s not committed", k)
		}
	}
	assertIdle(t, g)
}

func TestGroupCommitBoundsABatch(t *testing.T) {
	db, g := openGroupCommit(t)
	g.max = 4
	before := lastTxID(t, db)
	var fns []func(*bbolt.Tx) error
	for i := range 10 {
		fns = append(fns, put(fmt.Sprint("k", i)))
	}
	for i, err := range runDuringCommit(t, g, fns...) {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if n := lastTxID(t, db) - before; n != 1+3 {
		t.Errorf("%d commits, want 4: the held call's, then 10 calls by 4", n)
	}
	assertIdle(t, g)
}

func TestGroupCommitConcurrentCallsShareCommits(t *testing.T) {
	db, g := openGroupCommit(t)
	const workers, each = 64, 20
	before := lastTxID(t, db)
	start := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range workers {
		wg.Go(func() {
			<-start
			for i := range each {
				if err := g.do(t.Context(), put(fmt.Sprint(w, "/", i))); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d calls failed", failed.Load())
	}
	n := lastTxID(t, db) - before
	t.Logf("%d calls in %d commits", workers*each, n)
	if n >= workers*each {
		t.Errorf("%d calls took %d commits: none shared", workers*each, n)
	}
	var count int
	_ = db.View(func(tx *bbolt.Tx) error { count = tx.Bucket(gcBucket).Stats().KeyN; return nil })
	if count != workers*each {
		t.Errorf("%d keys committed, want %d", count, workers*each)
	}
	assertIdle(t, g)
}

func TestGroupCommitFailingCallFailsAlone(t *testing.T) {
	errRefused := errors.New("refused")
	errBoom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		fail    func(tx *bbolt.Tx, run int) error // run counts from 1
		check   func(error) bool
		commits int // after the held call's, one for the batch's retry, then the solo run's if it succeeds
		runs    int
		written bool
	}{
		{"error", func(tx *bbolt.Tx, _ int) error { return errRefused },
			func(err error) bool { return errors.Is(err, errRefused) }, 1, 2, false},
		{"panic", func(tx *bbolt.Tx, _ int) error { panic("boom") },
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "boom") }, 1, 2, false},
		{"panic with an error", func(tx *bbolt.Tx, _ int) error { panic(errBoom) },
			func(err error) bool { return errors.Is(err, errBoom) }, 1, 2, false},
		{"error in the batch only", func(tx *bbolt.Tx, run int) error {
			if run == 1 {
				return errRefused
			}
			return nil
		}, func(err error) bool { return err == nil }, 2, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, g := openGroupCommit(t)
			before := lastTxID(t, db)
			var runs atomic.Int64
			failing := func(tx *bbolt.Tx) error {
				if err := put("failing")(tx); err != nil {
					return err
				}
				return tc.fail(tx, int(runs.Add(1)))
			}
			errs := runDuringCommit(t, g, put("a"), put("b"), failing, put("c"), put("d"))
			if !tc.check(errs[2]) {
				t.Errorf("failing call: %v", errs[2])
			}
			for i, err := range errs {
				if i != 2 && err != nil {
					t.Errorf("call %d of the failing one's batch: %v", i, err)
				}
			}
			if r := runs.Load(); r != int64(tc.runs) {
				t.Errorf("failing fn ran %d times, want %d (once in the batch, once alone)", r, tc.runs)
			}
			if n := lastTxID(t, db) - before; n != 1+tc.commits {
				t.Errorf("%d commits, want %d", n, 1+tc.commits)
			}
			got := keysPresent(t, db, "a", "b", "c", "d", "failing")
			for _, k := range []string{"a", "b", "c", "d"} {
				if !got[k] {
					t.Errorf("%s not committed", k)
				}
			}
			if got["failing"] != tc.written {
				t.Errorf("failing call's write committed: %v, want %v", got["failing"], tc.written)
			}
			assertIdle(t, g)
		})
	}
}

func TestGroupCommitAfterCloseFails(t *testing.T) {
	db, g := openGroupCommit(t)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the first failure leaves nothing behind for the second
		if err := g.do(t.Context(), put("a")); !errors.Is(err, berrors.ErrDatabaseNotOpen) {
			t.Fatalf("do after close: %v", err)
		}
	}
	assertIdle(t, g)
}

func TestUpdateAfterCloseFails(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	err := s.update(t.Context(), "grant", &call{fn: put("a")}, nil)
	if !errors.Is(err, tokens.ErrStoreUnavailable) || !errors.Is(err, berrors.ErrDatabaseNotOpen) {
		t.Fatalf("update after Close: %v", err)
	}
}

// Lazy calls (the rejection log) wait out the gap after the last commit;
// an eager call does not, and takes the waiting lazy ones along in its
// commit.
func TestGroupCommitEagerCallSkipsTheGap(t *testing.T) {
	db, g := openGroupCommit(t)
	g.gap = time.Hour // a call that waited it out would never return
	lazy := func(key string) error {
		c := &call{fn: put(key), lazy: true}
		g.submit(c)
		return <-c.done
	}
	if err := lazy("first"); err != nil { // no commit before it: at once
		t.Fatal(err)
	}
	before := lastTxID(t, db)
	waited := make(chan error, 1)
	go func() { waited <- lazy("second") }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		g.mu.Lock()
		w := g.waiting
		g.mu.Unlock()
		if w {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lazy call did not wait out the gap")
		}
	}
	if err := g.do(t.Context(), put("eager")); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if n := lastTxID(t, db) - before; n != 1 {
		t.Errorf("%d commits for the eager call and the waiting lazy one, want 1", n)
	}
	for k, ok := range keysPresent(t, db, "first", "second", "eager") {
		if !ok {
			t.Errorf("%s not committed", k)
		}
	}
	assertIdle(t, g)
}

// pendingAtLeast tells whether n calls or more wait for a commit.
func (g *groupCommit) pendingAtLeast(n int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.pending) >= n
}
