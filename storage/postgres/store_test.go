package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

func grant(t *testing.T, s tokens.Store, resource string, ttl time.Duration) tokens.Lease {
	t.Helper()
	l, err := s.Grant(t.Context(), tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: "w-" + resource, TTL: ttl})
	if err != nil {
		t.Fatalf("Grant(%s): %v", resource, err)
	}
	return l
}

func TestGrantRenewRelease(t *testing.T) {
	t.Parallel()
	s := pgtest.OpenFresh(t)
	ctx := t.Context()

	if _, err := s.Resource(ctx, "r"); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Resource of a new name: %v, want ErrNotFound", err)
	}
	l1 := grant(t, s, "r", time.Minute)
	if l1.Token != 1 || l1.TTL != time.Minute || !l1.ExpiresAt.Equal(l1.GrantedAt.Add(time.Minute)) {
		t.Fatalf("first lease %+v", l1)
	}
	_, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "other", TTL: time.Minute})
	f := tokens.ErrorOf(err)
	if !errors.Is(err, tokens.ErrLeaseHeld) || f.Holder != l1.Holder || f.CurrentToken != 1 || f.RetryAfter <= 0 || f.RetryAfter > time.Minute {
		t.Fatalf("Grant of a held resource: %v %+v", err, f)
	}
	r, err := s.Resource(ctx, "r")
	if err != nil || r.Token != 1 || r.Lease == nil || r.Lease.ID != l1.ID || r.Now.IsZero() || r.Holder(r.Now) == nil {
		t.Fatalf("Resource: %+v %v", r, err)
	}
	renewed, err := s.Renew(ctx, l1.ID, 2*time.Minute)
	if err != nil || renewed.TTL != 2*time.Minute || !renewed.ExpiresAt.After(l1.ExpiresAt) {
		t.Fatalf("Renew: %+v %v", renewed, err)
	}
	again, err := s.Renew(ctx, l1.ID, 0) // reuses the last TTL
	if err != nil || again.TTL != 2*time.Minute {
		t.Fatalf("Renew(0): %+v %v", again, err)
	}
	rel, err := s.Release(ctx, l1.ID)
	if err != nil || !rel.Released() {
		t.Fatalf("Release: %+v %v", rel, err)
	}
	if rel2, err := s.Release(ctx, l1.ID); err != nil || !rel2.ReleasedAt.Equal(rel.ReleasedAt) {
		t.Fatalf("second Release: %+v %v, want idempotent success", rel2, err)
	}
	if _, err := s.Renew(ctx, l1.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Renew after release: %v", err)
	}
	l2 := grant(t, s, "r", time.Minute)
	if l2.Token != 2 {
		t.Fatalf("second token %d", l2.Token)
	}
	if _, err := s.Release(ctx, "fl_nope"); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Release unknown: %v", err)
	}
	if _, err := s.Renew(ctx, "fl_nope", 0); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Renew unknown: %v", err)
	}
	if _, err := s.Lease(ctx, "fl_nope"); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Lease unknown: %v", err)
	}
	cur, err := s.CurrentLeases(ctx, 10)
	if err != nil || len(cur) != 1 || cur[0].ID != l2.ID {
		t.Fatalf("CurrentLeases: %+v %v", cur, err)
	}
	h, err := s.History(ctx, "r", 10)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []tokens.EventKind
	for _, e := range h {
		kinds = append(kinds, e.Kind)
	}
	want := fmt.Sprint([]tokens.EventKind{tokens.EventGranted, tokens.EventRenewRefused, tokens.EventReleased, tokens.EventRenewed, tokens.EventRenewed, tokens.EventGranted})
	if fmt.Sprint(kinds) != want {
		t.Fatalf("history %v, want %v", kinds, want)
	}
}

func TestExpiryByDatabaseClock(t *testing.T) {
	t.Parallel()
	s := pgtest.OpenFresh(t)
	ctx := t.Context()
	l1 := grant(t, s, "x", 100*time.Millisecond)
	storagetest.WaitPast(t, s, "x", l1.ExpiresAt)
	if _, err := s.Renew(ctx, l1.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Renew of an expired lease: %v", err)
	}
	if _, err := s.Release(ctx, l1.ID); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Release of an expired lease: %v", err)
	}
	l2 := grant(t, s, "x", time.Minute)
	if l2.Token != 2 {
		t.Fatalf("token %d", l2.Token)
	}
	r, _ := s.Resource(ctx, "x")
	if err := tokens.Judge(l1, r, r.Now); !errors.Is(err, tokens.ErrStaleToken) {
		t.Fatalf("Judge(old): %v", err)
	}
	if err := tokens.Judge(l2, r, r.Now); err != nil {
		t.Fatalf("Judge(current): %v", err)
	}
	if _, err := s.Release(ctx, l1.ID); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Release of a superseded lease: %v", err)
	}
}

func TestDrainMakesGrantsBusy(t *testing.T) {
	t.Parallel()
	s := pgtest.OpenFresh(t)
	ctx := t.Context()
	l := grant(t, s, "d", time.Minute)
	const drain = 3 * time.Second
	started := time.Now()
	if err := s.Drain(ctx, "d", drain); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	_, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "d", TTL: time.Minute})
	// A grant answered before drain had passed since the drain began was
	// decided inside it, however slow the machine: it must be refused,
	// with at most the drain to wait. One answered later is not judged.
	if took := time.Since(started); took < drain {
		if f := tokens.ErrorOf(err); !errors.Is(err, tokens.ErrFenceBusy) || f.RetryAfter <= 0 || f.RetryAfter > drain {
			t.Fatalf("Grant while draining: %v", err)
		}
	} else if err == nil {
		t.Skipf("the first grant came %v after the drain began, past its end", took)
	}
	// Grants are refused until the drain ends, and none of them uses up a
	// token.
	deadline := time.Now().Add(10 * time.Second)
	for {
		l2, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "d", TTL: time.Minute, Holder: "h"})
		if err == nil {
			if l2.Token != 2 {
				t.Fatalf("token after the drain: %d (a refused grant must not use up a token)", l2.Token)
			}
			return
		}
		if !errors.Is(err, tokens.ErrFenceBusy) {
			t.Fatalf("Grant after the drain: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the drain never ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestConcurrentGrantsIssueEachTokenOnce(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	a := pgtest.Open(t, schema, postgres.Options{})
	b := pgtest.Open(t, schema, postgres.Options{}) // a second replica
	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for i := range 16 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			for range 10 {
				l, err := s.Grant(t.Context(), tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "hot", TTL: time.Minute})
				if errors.Is(err, tokens.ErrLeaseHeld) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[l.Token] {
					t.Errorf("token %d issued twice", l.Token)
				}
				seen[l.Token] = true
				mu.Unlock()
				if _, err := s.Release(t.Context(), l.ID); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	r, err := a.Resource(t.Context(), "hot")
	if err != nil || r.Token != int64(len(seen)) {
		t.Fatalf("last token %d, %d grants succeeded (%v)", r.Token, len(seen), err)
	}
}

func TestRejections(t *testing.T) {
	t.Parallel()
	s := pgtest.OpenFresh(t)
	ctx := t.Context()
	ended := time.Now().Add(-time.Second).UTC().Truncate(time.Microsecond)
	var ids []int64
	for i := range 5 {
		res := "a"
		if i%2 == 1 {
			res = "b"
		}
		r, err := s.RecordRejection(ctx, tokens.Rejection{Resource: res, Code: tokens.CodeStaleToken, Token: int64(i), CurrentToken: 9,
			Holder: "h", LeaseHint: "fl_abcdef…", Method: "PUT", Upstream: "up", Path: "/p", LeaseEndedAt: ended})
		if err != nil || r.ID == 0 || r.At.IsZero() {
			t.Fatalf("RecordRejection: %+v %v", r, err)
		}
		ids = append(ids, r.ID)
	}
	all, err := s.Rejections(ctx, tokens.RejectionQuery{Limit: 3})
	if err != nil || len(all) != 3 || all[0].ID != ids[4] || !all[0].LeaseEndedAt.Equal(ended) || all[0].Path != "/p" {
		t.Fatalf("first page: %+v %v", all, err)
	}
	next, err := s.Rejections(ctx, tokens.RejectionQuery{Before: all[2].ID, Limit: 3})
	if err != nil || len(next) != 2 || next[1].ID != ids[0] {
		t.Fatalf("second page: %+v %v", next, err)
	}
	bs, err := s.Rejections(ctx, tokens.RejectionQuery{Resource: "b"})
	if err != nil || len(bs) != 2 {
		t.Fatalf("resource b: %+v %v", bs, err)
	}
	none, err := s.Rejections(ctx, tokens.RejectionQuery{Since: time.Now().Add(time.Hour)})
	if err != nil || len(none) != 0 {
		t.Fatalf("since the future: %+v %v", none, err)
	}
}

// A storm of concurrent rejections is committed in groups: every caller
// gets its own committed row back, none is lost or duplicated, and Close
// waits for what was queued.
func TestConcurrentRejectionsAreGrouped(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	s := pgtest.Open(t, schema, postgres.Options{MaxConns: 2})
	ctx := t.Context()
	const callers, each = 64, 20
	var mu sync.Mutex
	seen := map[int64]tokens.Rejection{}
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range each {
				r, err := s.RecordRejection(ctx, tokens.Rejection{Resource: "storm", Code: tokens.CodeStaleToken, Token: int64(c*each + i),
					CurrentToken: 1 << 40, Holder: "h", LeaseHint: "fl_x", Method: "POST", Upstream: "up", Path: fmt.Sprintf("/%d/%d", c, i)})
				if err != nil {
					t.Errorf("RecordRejection: %v", err)
					return
				}
				mu.Lock()
				if prev, dup := seen[r.ID]; dup {
					t.Errorf("id %d given twice: %+v and %+v", r.ID, prev, r)
				}
				seen[r.ID] = r
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != callers*each {
		t.Fatalf("%d rejections recorded, want %d", len(seen), callers*each)
	}
	for id, r := range seen {
		if r.Path != fmt.Sprintf("/%d/%d", r.Token/each, r.Token%each) || r.At.IsZero() {
			t.Fatalf("id %d came back as %+v: not the caller's own row", id, r)
		}
	}
	var stored []tokens.Rejection
	for before := int64(0); ; {
		page, err := s.Rejections(ctx, tokens.RejectionQuery{Resource: "storm", Before: before, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, page...)
		if len(page) < 1000 {
			break
		}
		before = page[len(page)-1].ID
	}
	if len(stored) != callers*each {
		t.Fatalf("the log holds %d rows, want %d", len(stored), callers*each)
	}
	for _, r := range stored {
		if got := seen[r.ID]; got.Token != r.Token || got.Path != r.Path {
			t.Fatalf("row %d is %+v, its caller was told %+v", r.ID, r, got)
		}
	}

	// Close while callers are recording: each either gets its committed row
	// or an unavailable error, never a hang.
	s2 := pgtest.Open(t, schema, postgres.Options{})
	var ok, refused int
	var wg2, recording sync.WaitGroup
	recording.Add(16)
	for range 16 {
		wg2.Go(func() {
			for i := range 50 {
				if i == 1 {
					recording.Done() // its first record is done: Close lands among the rest
				}
				_, err := s2.RecordRejection(context.Background(), tokens.Rejection{Resource: "closing", Code: tokens.CodeStaleToken, Holder: "h", LeaseHint: "fl_x"})
				mu.Lock()
				if err == nil {
					ok++
				} else if errors.Is(err, tokens.ErrStoreUnavailable) {
					refused++
				} else {
					t.Errorf("RecordRejection during Close: %v", err)
				}
				mu.Unlock()
			}
		})
	}
	recording.Wait()
	if err := s2.Close(); err != nil {
		t.Error(err)
	}
	wg2.Wait()
	closing, err := s.Rejections(ctx, tokens.RejectionQuery{Resource: "closing", Limit: 1000})
	if err != nil || len(closing) != ok || ok+refused != 16*50 {
		t.Fatalf("during Close: %d ok, %d refused, %d rows stored (%v)", ok, refused, len(closing), err)
	}
}

// Replicas starting together migrate a fresh schema once: every migration
// is recorded exactly once (goose's version 0 row, then one row per file),
// and the schema works.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { pgtest.Open(t, schema, postgres.Options{}) })
	}
	wg.Wait()
	s := pgtest.Open(t, schema, postgres.Options{})
	grant(t, s, "ok", time.Minute)
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migrations: %v %v", files, err)
	}
	rows := migrationRows(t, s)
	if len(rows) != len(files)+1 {
		t.Fatalf("%d rows in fencegw_migrations for %d migrations opened five times: %v", len(rows), len(files), rows)
	}
	for i, r := range rows {
		if r.Version != int64(i) || !r.Applied {
			t.Fatalf("fencegw_migrations row %d is %+v, want version %d applied once: %v", i, r, i, rows)
		}
	}
}

func TestUnreachableIsUnavailable(t *testing.T) {
	t.Parallel()
	s := pgtest.OpenFresh(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	_, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", TTL: time.Minute})
	if !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("Grant on a closed store: %v", err)
	}
	if _, err := s.Resource(ctx, "r"); !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("Resource on a closed store: %v", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("Ping on a closed store: %v", err)
	}
	if _, err := s.ExclusiveFence(ctx, "r"); !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("exclusive lock on a closed store: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = postgres.Open(cctx, "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1", postgres.Options{})
	if !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("Open of an unreachable database: %v", err)
	}
}

// Retention keeps the rejection log, each resource's history and ended
// leases bounded, and never touches a fence: tokens go on from where they
// were.
func TestPruneBoundsWhatIsKept(t *testing.T) {
	t.Parallel()
	s := pgtest.Open(t, pgtest.NewSchema(t), postgres.Options{MaxRejectionLog: 10, MaxHistoryPerResource: 5,
		LeaseRetention: time.Millisecond, PruneInterval: -1})
	ctx := t.Context()

	var newest []int64
	for i := range 25 {
		r, err := s.RecordRejection(ctx, tokens.Rejection{Resource: "log", Code: tokens.CodeStaleToken, Token: int64(i), Holder: "h", LeaseHint: "fl_x"})
		if err != nil {
			t.Fatal(err)
		}
		newest = append(newest, r.ID)
	}
	old := grant(t, s, "hist", time.Second) // token 1: 1 event; long enough for six renewals on a loaded machine
	for range 6 {
		renewed, err := s.Renew(ctx, old.ID, 0) // 6 more
		if err != nil {
			t.Fatal(err)
		}
		old = renewed
	}
	storagetest.WaitPast(t, s, "hist", old.ExpiresAt)
	cur := grant(t, s, "hist", time.Minute) // token 2, supersedes the expired one
	quiet := grant(t, s, "quiet", time.Minute)
	if err := s.AddWrites(ctx, []tokens.TokenWrites{{Resource: "hist", Token: old.Token, N: 3}, {Resource: "hist", Token: cur.Token, N: 2}}); err != nil {
		t.Fatal(err)
	}

	p, err := s.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Rejections != 15 || p.Events != 3 || p.Leases != 1 || p.WriteCounts != 1 {
		t.Fatalf("pruned %+v, want 15 rejections, 3 events, 1 lease and its write count", p)
	}
	if counts, err := s.Writes(ctx, "hist", []int64{old.Token, cur.Token}); err != nil || counts[old.Token] != 0 || counts[cur.Token] != 2 {
		t.Fatalf("write counts after prune: %v %v; want only the current token's", counts, err)
	}
	log, err := s.Rejections(ctx, tokens.RejectionQuery{Limit: 1000})
	if err != nil || len(log) != 10 || log[0].ID != newest[24] || log[9].ID != newest[15] {
		t.Fatalf("rejection log after prune: %d rows (%v)", len(log), err)
	}
	hist, err := s.History(ctx, "hist", 1000)
	if err != nil || len(hist) != 5 || hist[0].Token != 2 || hist[0].Kind != tokens.EventGranted {
		t.Fatalf("history after prune: %+v %v", hist, err)
	}
	if _, err := s.Lease(ctx, old.ID); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("the superseded, long-expired lease: %v, want ErrNotFound", err)
	}
	for _, l := range []tokens.Lease{cur, quiet} {
		if _, err := s.Lease(ctx, l.ID); err != nil {
			t.Fatalf("current lease %s pruned: %v", l.Resource, err)
		}
	}
	if again, err := s.Prune(ctx); err != nil || again != (postgres.Pruned{}) {
		t.Fatalf("second prune: %+v %v, want nothing", again, err)
	}
	r, err := s.Resource(ctx, "hist")
	if err != nil || r.Token != 2 {
		t.Fatalf("fence after prune: %+v %v", r, err)
	}
	if next := grantAfter(t, s, "hist", cur); next.Token != 3 {
		t.Fatalf("token after prune: %d, want 3", next.Token)
	}
}

// grantAfter releases prev and grants its resource again.
func grantAfter(t *testing.T, s tokens.Store, resource string, prev tokens.Lease) tokens.Lease {
	t.Helper()
	if _, err := s.Release(t.Context(), prev.ID); err != nil {
		t.Fatal(err)
	}
	return grant(t, s, resource, time.Minute)
}
