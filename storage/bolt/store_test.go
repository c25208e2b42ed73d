package bolt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openAt(t testing.TB, path string, opts Options) *Store {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	s, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Harness{
		Open: func(t *testing.T) tokens.Store {
			return openAt(t, filepath.Join(t.TempDir(), "data", "fencegw.db"), Options{})
		},
		Reopen: func(t *testing.T, s tokens.Store) tokens.Store {
			b := s.(*Store)
			path := b.db.Path()
			if err := b.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return openAt(t, path, Options{})
		},
	})
}

func TestOpenCreatesDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "fencegw.db")
	s := openAt(t, path, Options{})
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

func TestClosedStoreIsUnavailable(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{})
	l, err := s.Grant(t.Context(), tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := t.Context()
	checks := map[string]error{
		"Ping":  s.Ping(ctx),
		"Grant": second(s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r2", Holder: "h", TTL: time.Minute})),
		"Renew": second(s.Renew(ctx, l.ID, 0)),
		"Lease": second(s.Lease(ctx, l.ID)),
		"Res":   second(s.Resource(ctx, "r")),
		"Rej":   second(s.RecordRejection(ctx, tokens.Rejection{Resource: "r"})),
		"Drain": s.Drain(ctx, "r", time.Second),
	}
	for name, err := range checks {
		if !errors.Is(err, tokens.ErrStoreUnavailable) {
			t.Errorf("%s after Close: %v, want ErrStoreUnavailable", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// TestStoreClock checks that expiry follows Options.Now, not the wall clock.
func TestStoreClock(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{Now: clock})
	ctx := t.Context()
	a, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !a.ExpiresAt.Equal(clock().Add(time.Minute)) {
		t.Fatalf("ExpiresAt = %v, want store clock + 1m", a.ExpiresAt)
	}
	now.Add(int64(59 * time.Second))
	_, err = s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "b", TTL: time.Minute})
	if f := tokens.ErrorOf(err); f == nil || !errors.Is(err, tokens.ErrLeaseHeld) || f.RetryAfter != time.Second {
		t.Fatalf("Grant at +59s: %v, want ErrLeaseHeld with RetryAfter 1s", err)
	}
	if r, _ := s.Resource(ctx, "r"); !r.Now.Equal(clock()) {
		t.Fatalf("Resource.Now = %v, want the store clock %v", r.Now, clock())
	}
	now.Add(int64(time.Second))
	b, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "b", TTL: time.Minute})
	if err != nil || b.Token != 2 {
		t.Fatalf("Grant at expiry = %+v, %v; want token 2", b, err)
	}
}

// TestCacheCopies checks that callers cannot change the store's state
// through what it returns.
func TestCacheCopies(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{})
	ctx := t.Context()
	a, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	r1, _ := s.Resource(ctx, "r")
	r1.Lease.Holder = "mallory"
	r1.Lease.ExpiresAt = time.Time{}
	r2, _ := s.Resource(ctx, "r")
	if r2.Lease == r1.Lease || r2.Lease.Holder != "a" || !r2.Lease.ExpiresAt.Equal(a.ExpiresAt) {
		t.Fatalf("Resource shares its lease: %+v", r2.Lease)
	}
}

func TestRetention(t *testing.T) {
	const maxRej, maxHist = 40, 5
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{MaxRejections: maxRej, MaxHistoryPerResource: maxHist})
	ctx := t.Context()
	var last tokens.Rejection
	for i := range 100 {
		r, err := s.RecordRejection(ctx, tokens.Rejection{Resource: fmt.Sprint("r", i%3), Code: tokens.CodeStaleToken})
		if err != nil {
			t.Fatal(err)
		}
		last = r
		n := countRejections(t, s)
		if n > maxRej {
			t.Fatalf("after %d rejections the log holds %d, cap %d", i+1, n, maxRej)
		}
	}
	list, err := s.Rejections(ctx, tokens.RejectionQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) < maxRej/2 || list[0].ID != last.ID {
		t.Fatalf("after pruning %d rejections kept, newest %d; want the newest (%d) and at least %d", len(list), list[0].ID, last.ID, maxRej/2)
	}
	for _, name := range []string{"r0", "r1", "r2"} {
		got, err := s.Rejections(ctx, tokens.RejectionQuery{Resource: name, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range got {
			if r.Resource != name {
				t.Fatalf("index of %s lists a rejection of %s", name, r.Resource)
			}
		}
	}

	l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "h", Holder: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := s.Renew(ctx, l.ID, 0); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := s.History(ctx, "h", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != maxHist || hist[0].Kind != tokens.EventRenewed {
		t.Fatalf("history holds %d events (newest %v), want %d", len(hist), hist[0].Kind, maxHist)
	}
}

func countRejections(t *testing.T, s *Store) int {
	t.Helper()
	n := 0
	if err := s.db.View(func(tx *bbolt.Tx) error {
		n = tx.Bucket(bucketRejections).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLeaseGC(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{Now: clock})
	ctx := t.Context()
	grant := func(holder string) tokens.Lease {
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: holder, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	old := grant("old")
	if _, err := s.Release(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	cur := grant("cur")
	now.Add(int64(LeaseRetention + 2*time.Minute))
	n, err := s.collectLeases()
	if err != nil || n != 1 {
		t.Fatalf("collectLeases = %d, %v; want 1", n, err)
	}
	if _, err := s.Lease(ctx, old.ID); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("collected lease: %v, want ErrNotFound", err)
	}
	if _, err := s.Lease(ctx, cur.ID); err != nil {
		t.Fatalf("the current lease was collected: %v", err)
	}
	s2 := reopen(t, s, Options{Now: clock})
	if _, err := s2.Lease(ctx, old.ID); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("collected lease after reopen: %v, want ErrNotFound", err)
	}
}

func reopen(t *testing.T, s *Store, opts Options) *Store {
	t.Helper()
	path := s.db.Path()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return openAt(t, path, opts)
}

// TestCorruptValues checks that unreadable records are errors, not panics:
// the store reads records when they are needed (the cache holds only some),
// so a corrupt one fails the operation that reads it, closed, with
// ErrStoreUnavailable.
func TestCorruptValues(t *testing.T) {
	ctx := context.Background()
	readLease := func(s *Store) error {
		_, err := s.Lease(ctx, "fl_x")
		return err
	}
	readResource := func(s *Store) error {
		if _, err := s.Resource(ctx, "r"); err == nil {
			return errors.New("Resource read a corrupt record")
		}
		_, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "b", TTL: time.Minute})
		return err
	}
	cases := []struct {
		name   string
		bucket []byte
		key    []byte
		val    []byte
		// check runs against the reopened store.
		check func(*Store) error
	}{
		{"lease truncated", bucketLeases, leaseKey("fl_x"), []byte{codecVersion, 0x05, 'a'}, readLease},
		{"lease huge length", bucketLeases, leaseKey("fl_x"), []byte{codecVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, readLease},
		{"resource bad version", bucketResources, resourcePrefix("r"), []byte{99, 1, 2}, readResource},
		{"resource empty", bucketResources, resourcePrefix("r"), []byte{}, readResource},
		{"rejection garbage", bucketRejections, seqKey(1), []byte{codecVersion, 0x80}, func(s *Store) error {
			_, err := s.Rejections(ctx, tokens.RejectionQuery{})
			return err
		}},
		{"event trailing bytes", nil, nil, nil, func(s *Store) error {
			_, err := s.History(ctx, "h", 0)
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fencegw.db")
			s := openAt(t, path, Options{})
			if _, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "h", Holder: "a", TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
			err := s.db.Update(func(tx *bbolt.Tx) error {
				if tc.bucket == nil { // corrupt the history event of the grant
					b := tx.Bucket(bucketEvents)
					v := append([]byte(nil), b.Get(resourceKey("h", 1))...)
					return b.Put(resourceKey("h", 1), append(v, 0))
				}
				return tx.Bucket(tc.bucket).Put(tc.key, tc.val)
			})
			if err != nil {
				t.Fatal(err)
			}
			path = s.db.Path()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s2, err := Open(path, Options{Logger: quiet})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s2.Close()
			if err := tc.check(s2); !errors.Is(err, tokens.ErrStoreUnavailable) || !errors.Is(err, errCorrupt) {
				t.Fatalf("reading a corrupt record: %v, want ErrStoreUnavailable caused by a corrupt record", err)
			}
		})
	}
}

// FuzzDecode checks the codec both ways. Arbitrary bytes never make a
// decoder panic, and what decodes re-encodes to the same record. Records
// built from the fuzzer's fields (tokens of the whole int64 range, above
// 2^53 included, where a float64 loses a bit) come back equal from
// decode(encode(x)): a token read back wrong from the file is a token
// issued twice (guarantee 3).
func FuzzDecode(f *testing.F) {
	l := tokens.Lease{Resource: "r", Holder: "h", Token: 3, TTL: time.Second, GrantedAt: time.Unix(1, 0), ExpiresAt: time.Unix(2, 0)}
	seeds := [][]byte{
		encodeLease(&l),
		encodeResource(&resState{token: 3, current: "fl_x"}),
		encodeRejection(&tokens.Rejection{Resource: "r", Code: "c"}),
		encodeEvent(&tokens.Event{Kind: tokens.EventGranted}),
	}
	for i, b := range seeds {
		f.Add(b, int64(i+1), int64(time.Second), int64(1700000000e9), int64(1700000001e9), int64(0), "inventory/SKU-1", tokens.NewLeaseID())
	}
	f.Add([]byte{}, int64(1<<53+1), int64(time.Minute), int64(1), int64(-1), int64(5), "r", "fl_x")
	f.Add([]byte{}, int64(math.MaxInt64), int64(0), int64(0), int64(0), int64(0), "", "")
	f.Fuzz(func(t *testing.T, b []byte, token, ttl, granted, expires, released int64, name, id string) {
		if l, err := decodeLease("id", b); err == nil {
			if again, err := decodeLease("id", encodeLease(&l)); err != nil || !sameLease(again, l) {
				t.Fatalf("lease %+v re-encoded came back as %+v, %v", l, again, err)
			}
		}
		if r, err := decodeResource(b); err == nil {
			if again, err := decodeResource(encodeResource(&r)); err != nil || !sameResource(again, r) {
				t.Fatalf("resource %+v re-encoded came back as %+v, %v", r, again, err)
			}
		}
		if r, err := decodeRejection(1, b); err == nil {
			if again, err := decodeRejection(1, encodeRejection(&r)); err != nil || !reflect.DeepEqual(again, r) {
				t.Fatalf("rejection %+v re-encoded came back as %+v, %v", r, again, err)
			}
		}
		if ev, err := decodeEvent("r", b); err == nil {
			if again, err := decodeEvent("r", encodeEvent(&ev)); err != nil || !reflect.DeepEqual(again, ev) {
				t.Fatalf("event %+v re-encoded came back as %+v, %v", ev, again, err)
			}
		}

		// Times as the store keeps them (Unix nanoseconds, 0 the zero
		// time), within a few centuries so that offsets between them fit.
		at := func(n int64) time.Time { return fromUnixNano(n % (1 << 61)) }
		lease := tokens.Lease{ID: "id", Resource: name, Holder: id, Owner: name + id, Token: token, TTL: time.Duration(ttl % (1 << 60)),
			GrantedAt: at(granted), ExpiresAt: at(expires), ReleasedAt: at(released)}
		if got, err := decodeLease("id", encodeLease(&lease)); err != nil || !sameLease(got, lease) {
			t.Fatalf("lease round trip = %+v, %v; want %+v", got, err, lease)
		}
		res := resState{token: token, current: id, drainUntil: at(expires)}
		if got, err := decodeResource(encodeResource(&res)); err != nil || !sameResource(got, res) {
			t.Fatalf("resource round trip = %+v, %v; want %+v", got, err, res)
		}
		rej := tokens.Rejection{ID: 1, At: at(granted), Resource: name, Code: id, Token: token, CurrentToken: token ^ 1, Holder: id,
			LeaseHint: name, Method: "PUT", Upstream: name, Path: id, LeaseEndedAt: at(released), Principal: name}
		if got, err := decodeRejection(1, encodeRejection(&rej)); err != nil || !reflect.DeepEqual(got, rej) {
			t.Fatalf("rejection round trip = %+v, %v; want %+v", got, err, rej)
		}
	})
}

func sameLease(a, b tokens.Lease) bool {
	return a.ID == b.ID && a.Resource == b.Resource && a.Holder == b.Holder && a.Owner == b.Owner && a.Token == b.Token && a.TTL == b.TTL &&
		a.GrantedAt.Equal(b.GrantedAt) && a.ExpiresAt.Equal(b.ExpiresAt) && a.ReleasedAt.Equal(b.ReleasedAt)
}

func sameResource(a, b resState) bool {
	return a.token == b.token && a.current == b.current && a.drainUntil.Equal(b.drainUntil)
}

func TestCodecRoundTrip(t *testing.T) {
	l := tokens.Lease{ID: "fl_x", Resource: "inventory/SKU-1", Holder: "wörker", Token: 1<<53 + 1, TTL: 1500 * time.Millisecond,
		GrantedAt: time.Unix(1700000000, 123), ExpiresAt: time.Unix(1700000001, 623), ReleasedAt: time.Unix(1700000000, 999)}
	got, err := decodeLease(l.ID, encodeLease(&l))
	if err != nil || got.Resource != l.Resource || got.Holder != l.Holder || got.Token != l.Token || got.TTL != l.TTL ||
		!got.GrantedAt.Equal(l.GrantedAt) || !got.ExpiresAt.Equal(l.ExpiresAt) || !got.ReleasedAt.Equal(l.ReleasedAt) {
		t.Fatalf("lease round trip = %+v, %v; want %+v", got, err, l)
	}
	// Tokens above 2^53, where a float64 would lose the last bit (the
	// torture's tokens start there).
	for _, token := range []int64{1<<53 + 1, 1<<62 + 3, math.MaxInt64} {
		res := resState{token: token, current: tokens.NewLeaseID()}
		if got, err := decodeResource(encodeResource(&res)); err != nil || got.token != token || got.current != res.current {
			t.Fatalf("resource round trip of token %d = %+v, %v", token, got, err)
		}
	}
	l.ReleasedAt = time.Time{}
	if got, _ := decodeLease(l.ID, encodeLease(&l)); !got.ReleasedAt.IsZero() {
		t.Fatalf("zero ReleasedAt came back as %v", got.ReleasedAt)
	}
	r := tokens.Rejection{ID: 9, At: time.Unix(5, 6), Resource: "r", Code: "stale_token", Token: 1, CurrentToken: 2, Holder: "h",
		LeaseHint: "fl_abc…", Method: "PUT", Upstream: "u", Path: "/p?q=1", LeaseEndedAt: time.Unix(4, 0)}
	gotR, err := decodeRejection(9, encodeRejection(&r))
	if err != nil || !gotR.At.Equal(r.At) || !gotR.LeaseEndedAt.Equal(r.LeaseEndedAt) {
		t.Fatalf("rejection round trip = %+v, %v", gotR, err)
	}
	gotR.At, gotR.LeaseEndedAt, r.At, r.LeaseEndedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if gotR != r {
		t.Fatalf("rejection round trip = %+v, want %+v", gotR, r)
	}
}

// Concurrent rejections are committed in groups (at most one commit per
// rejectionGap): every caller gets its own durable entry back, none is lost
// or given twice, and a reopened store has them all.
func TestConcurrentRejectionsAreGrouped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegw.db")
	s := openAt(t, path, Options{})
	ctx := context.Background()
	const callers, each = 32, 25
	var mu sync.Mutex
	seen := map[int64]tokens.Rejection{}
	var wg sync.WaitGroup
	start := time.Now()
	for c := range callers {
		wg.Go(func() {
			for i := range each {
				r, err := s.RecordRejection(ctx, tokens.Rejection{Resource: "storm", Code: tokens.CodeStaleToken, Token: int64(c*each + i), Holder: "h"})
				if err != nil {
					t.Errorf("RecordRejection: %v", err)
					return
				}
				mu.Lock()
				if _, dup := seen[r.ID]; dup {
					t.Errorf("id %d given twice", r.ID)
				}
				seen[r.ID] = r
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(seen) != callers*each {
		t.Fatalf("%d recorded, want %d", len(seen), callers*each)
	}
	// Each caller waits for a commit per entry; without grouping that would
	// be callers*each commits, with it at most one per gap. Not a timing
	// assertion: a lower bound that holds on any machine.
	if minimum := time.Duration(each-1) * rejectionGap; elapsed < minimum {
		t.Fatalf("%d rounds of rejections took %v: commits were not spaced by %v", each, elapsed, rejectionGap)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openAt(t, path, Options{})
	var stored int
	for before := int64(0); ; {
		page, err := s2.Rejections(ctx, tokens.RejectionQuery{Resource: "storm", Before: before, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page {
			if got, ok := seen[r.ID]; !ok || got.Token != r.Token {
				t.Fatalf("stored %+v, its caller was told %+v", r, got)
			}
		}
		stored += len(page)
		if len(page) < 1000 {
			break
		}
		before = page[len(page)-1].ID
	}
	if stored != callers*each {
		t.Fatalf("reopened store has %d, want %d", stored, callers*each)
	}
}

func TestKeysConformance(t *testing.T) {
	storagetest.RunKeys(t, storagetest.KeyHarness{
		Open: func(t *testing.T) tokens.IdempotencyStore {
			return openAt(t, filepath.Join(t.TempDir(), "data", "fencegw.db"), Options{})
		},
		Reopen: func(t *testing.T, s tokens.IdempotencyStore) tokens.IdempotencyStore {
			b := s.(*Store)
			path := b.db.Path()
			if err := b.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return openAt(t, path, Options{})
		},
	})
}

// Seed sets the last token of each resource, never lowers one, and leaves a
// file that opens cleanly.
func TestSeed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data", "fencegw.db")
	if err := Seed(path, 1<<53, "a", "b/c"); err != nil {
		t.Fatal(err)
	}
	if err := Seed(path, 5, "a"); err != nil {
		t.Fatal(err)
	}
	s := openAt(t, path, Options{CrashDrain: time.Hour})
	ctx := t.Context()
	for _, r := range []string{"a", "b/c"} {
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: r, Holder: "h", TTL: time.Minute})
		if err != nil || l.Token != 1<<53+1 {
			t.Fatalf("grant on seeded %q = %+v, %v; want token 2^53+1 at once", r, l, err)
		}
	}
}
