package bolt

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// TestFileOfMainOpens opens a file written by the store before the compact
// layout (main at 3786b66: resource states keyed by name, leases by their
// id, codec version 4, lease ids in the live index; testdata/mkfixture
// wrote it) and wants the same answers as that store gave, for every
// resource, lease, history, current lease, write count and rejection; then
// the old leases work on (renew, release, supersede) next to new ones, and
// all of it survives a reopen.
func TestFileOfMainOpens(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fencegw.db")
	if err := os.WriteFile(path, gunzip(t, "testdata/main-3786b66.db.gz"), 0o600); err != nil {
		t.Fatal(err)
	}
	var fixture struct {
		Now   time.Time
		Names []string
		IDs   []string
		Dump  json.RawMessage
	}
	if err := json.Unmarshal(gunzip(t, "testdata/main-3786b66.json.gz"), &fixture); err != nil {
		t.Fatal(err)
	}
	var now atomic.Int64
	now.Store(fixture.Now.UnixNano())
	opts := Options{Now: func() time.Time { return time.Unix(0, now.Load()) }, CacheEntries: 16}
	s := openAt(t, path, opts)
	ctx := t.Context()
	check := func(when string) {
		t.Helper()
		d, err := dumpStore(ctx, s, fixture.Names, fixture.IDs)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		got, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, fixture.Dump) {
			t.Fatalf("%s: the store answers\n%.3000s\nwant what the old store answered\n%.3000s", when, got, fixture.Dump)
		}
	}
	check("opened")
	if err := s.db.View(func(tx *bbolt.Tx) error {
		for _, old := range [][]byte{bucketResourcesByName, bucketLeasesByID, bucketWrites} {
			if tx.Bucket(old) != nil {
				return fmt.Errorf("bucket %s is still there", old)
			}
		}
		if err := onlyLayoutGuard(tx); err != nil {
			return err
		}
		if n := tx.Bucket(bucketLeases).Stats().KeyN; n != len(fixture.IDs) {
			return fmt.Errorf("%d leases moved, want %d", n, len(fixture.IDs))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, opts) // nothing left to move
	check("reopened")

	// The old leases work on. "old" has an id of the format before
	// time-ordered ids; "a/1" a time-ordered one stored under the id itself.
	var d fixtureDump
	if err := json.Unmarshal(fixture.Dump, &d); err != nil {
		t.Fatal(err)
	}
	oldLease, a1 := d.Resources["old"].Lease, d.Resources["a/1"].Lease
	if _, ok := packLeaseID(oldLease.ID); ok {
		t.Fatalf("lease %s of the fixture is time-ordered; want one of the old format", oldLease.ID)
	}
	if _, err := s.Renew(ctx, oldLease.ID, 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, a1.ID); err != nil {
		t.Fatal(err)
	}
	next, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "a/1", Holder: "new", TTL: time.Minute})
	if err != nil || next.Token != a1.Token+1 {
		t.Fatalf("Grant(a/1) after its old lease's release = %+v, %v; want token %d", next, err, a1.Token+1)
	}
	if _, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "old", Holder: "new", TTL: time.Minute}); !errors.Is(err, tokens.ErrLeaseHeld) {
		t.Fatalf("Grant(old) while its renewed old-format lease is live = %v; want lease_held", err)
	}
	s = reopen(t, s, opts)
	if r, err := s.Resource(ctx, "a/1"); err != nil || r.Lease == nil || r.Lease.ID != next.ID || r.Token != next.Token {
		t.Fatalf("Resource(a/1) after a reopen = %+v, %v; want the new lease", r, err)
	}
	if l, err := s.Lease(ctx, a1.ID); err != nil || l.ReleasedAt.IsZero() {
		t.Fatalf("Lease(%s) of a/1 after release and reopen = %+v, %v; want it released", a1.ID, l, err)
	}
	if l, err := s.Lease(ctx, oldLease.ID); err != nil || l.TTL != 3*time.Hour {
		t.Fatalf("Lease(%s) after renew and reopen = %+v, %v; want the 3h renewal", oldLease.ID, l, err)
	}
	cur, err := s.CurrentLeases(ctx, 1000)
	if err != nil || len(cur) != len(d.Current) {
		t.Fatalf("CurrentLeases after the changes = %d leases, %v; want %d (a/1's lease replaced, old's renewed)", len(cur), err, len(d.Current))
	}
	h, err := s.History(ctx, "a/1", 0)
	if err != nil || len(h) != 3 || h[0].Kind != tokens.EventGranted || h[1].Kind != tokens.EventReleased || h[2].Token != a1.Token {
		t.Fatalf("History(a/1) = %+v, %v; want granted (old), released, granted", h, err)
	}
}

// onlyLayoutGuard checks that the old history bucket holds nothing but the
// layout guard, the sub-bucket older versions fail to move.
func onlyLayoutGuard(tx *bbolt.Tx) error {
	h := tx.Bucket(bucketHistory)
	if h == nil {
		return errors.New("no layout guard: the old history bucket is gone")
	}
	var names []string
	if err := h.ForEach(func(k, v []byte) error { names = append(names, string(k)); return nil }); err != nil {
		return err
	}
	if len(names) != 1 || names[0] != string(layoutGuard) {
		return fmt.Errorf("the old history bucket holds %q; want only the layout guard", names)
	}
	g := h.Bucket(layoutGuard)
	if g == nil {
		return errors.New("the layout guard is not a bucket")
	}
	k, _ := g.Cursor().First()
	if _, ok := keySeq(k); ok {
		return fmt.Errorf("the layout guard's key %q is a sequence number: older versions would move it", k)
	}
	return nil
}

func gunzip(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fixtureDump is what a store answers about the fixture's resources and
// leases, its times in UTC, so that two stores' answers compare as JSON.
type fixtureDump struct {
	Resources  map[string]*tokens.Resource
	Missing    []string // names Resource did not find
	Leases     map[string]tokens.Lease
	History    map[string][]tokens.Event
	Current    []tokens.Lease
	Writes     map[string]map[int64]uint64
	Rejections []fixtureRejection
}

// fixtureRejection is a tokens.Rejection with the fields of the fixture's
// time, in its order; the fields added since must read as zero.
type fixtureRejection struct {
	ID                                                   int64
	At                                                   time.Time
	Resource, Code                                       string
	Token, CurrentToken                                  int64
	Holder, LeaseHint, Method, Upstream, Path, Principal string
	LeaseEndedAt                                         time.Time
}

func dumpStore(ctx context.Context, s *Store, names, ids []string) (*fixtureDump, error) {
	d := &fixtureDump{Resources: map[string]*tokens.Resource{}, Leases: map[string]tokens.Lease{},
		History: map[string][]tokens.Event{}, Writes: map[string]map[int64]uint64{}}
	utc := func(t *time.Time) {
		if !t.IsZero() {
			*t = t.UTC()
		}
	}
	lease := func(l *tokens.Lease) { utc(&l.GrantedAt); utc(&l.ExpiresAt); utc(&l.ReleasedAt) }
	for _, n := range names {
		r, err := s.Resource(ctx, n)
		if err != nil {
			d.Missing = append(d.Missing, n)
		} else {
			utc(&r.DrainUntil)
			utc(&r.Now)
			if r.Lease != nil {
				lease(r.Lease)
			}
			d.Resources[n] = &r
		}
		h, err := s.History(ctx, n, 0)
		if err != nil {
			return nil, err
		}
		for i := range h {
			utc(&h[i].At)
			utc(&h[i].ExpiresAt)
			if h[i].Key != nil {
				utc(&h[i].Key.WriteAt)
			}
		}
		d.History[n] = h
		w, err := s.Writes(ctx, n, []int64{1, 2, 3})
		if err != nil {
			return nil, err
		}
		d.Writes[n] = w
	}
	for _, id := range ids {
		l, err := s.Lease(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("lease %s: %w", id, err)
		}
		lease(&l)
		d.Leases[id] = l
	}
	cur, err := s.CurrentLeases(ctx, 1000)
	if err != nil {
		return nil, err
	}
	for i := range cur {
		lease(&cur[i])
	}
	d.Current = cur
	rej, err := s.Rejections(ctx, tokens.RejectionQuery{})
	if err != nil {
		return nil, err
	}
	for i := range rej {
		r := &rej[i]
		utc(&r.At)
		utc(&r.LeaseEndedAt)
		if r.WouldRefuse || r.TraceID != "" {
			return nil, fmt.Errorf("rejection %d of the old store has a would_refuse or a trace id", r.ID)
		}
		// An entry of an older file is one refusal.
		if r.Repeats != 1 || !r.FirstAt.Equal(r.At) {
			return nil, fmt.Errorf("rejection %d of an older file: repeats %d, first_at %v, at %v, want one refusal", r.ID, r.Repeats, r.FirstAt, r.At)
		}
		d.Rejections = append(d.Rejections, fixtureRejection{r.ID, r.At, r.Resource, r.Code, r.Token, r.CurrentToken,
			r.Holder, r.LeaseHint, r.Method, r.Upstream, r.Path, r.Principal, r.LeaseEndedAt})
	}
	return d, nil
}

// A move to the compact layout cut off midway (here: a record of the old
// leases bucket it cannot move, after the resource states were moved) leaves
// a file that has the layout guard: a version older than the compact layout
// refuses it instead of opening it without the moved resource states, whose
// tokens would start again at 1. Fixed, the file then opens and the move
// completes.
func TestMigrationCutOffMidwayKeepsTheGuard(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegw.db")
	if err := os.WriteFile(path, gunzip(t, "testdata/main-3786b66.db.gz"), 0o600); err != nil {
		t.Fatal(err)
	}
	raw := func(fn func(tx *bbolt.Tx) error) {
		t.Helper()
		db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Update(fn); err != nil {
			t.Fatal(err)
		}
	}
	poison := []byte("poison")
	raw(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketLeasesByID) == nil || tx.Bucket(bucketResourcesByName) == nil {
			return errors.New("the fixture is not of the old layout")
		}
		_, err := tx.Bucket(bucketLeasesByID).CreateBucket(poison) // a bucket, not a record: migrateLeases fails on it
		return err
	})
	if s, err := Open(path, Options{}); err == nil {
		_ = s.Close()
		t.Fatal("Open moved a leases bucket holding a sub-bucket")
	}
	raw(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketResourcesByName) != nil {
			return errors.New("the resource states were not moved before the leases failed: the test proves nothing")
		}
		if h := tx.Bucket(bucketHistory); h == nil || h.Bucket(layoutGuard) == nil {
			return errors.New("records were moved to the compact layout, and the file has no layout guard")
		}
		return tx.Bucket(bucketLeasesByID).DeleteBucket(poison)
	})
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open after the cut-off move: %v", err)
	}
	defer s.Close()
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketLeasesByID) != nil {
			return errors.New("the old leases bucket is still there")
		}
		return onlyLayoutGuard(tx)
	}); err != nil {
		t.Fatal(err)
	}
}
