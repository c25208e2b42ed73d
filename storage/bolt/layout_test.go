package bolt

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// TestWriteCounts adds, reads and prunes write counts, and moves those of
// a file with one sub-bucket per resource (as written before
// bucketWriteCounts) over at open.
func TestWriteCounts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegw.db")
	s := openAt(t, path, Options{})
	ctx := t.Context()
	err := s.db.Update(func(tx *bbolt.Tx) error {
		old, err := tx.CreateBucket(bucketWrites)
		if err != nil {
			return err
		}
		for _, name := range []string{"a", "ab"} {
			b, err := old.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			if err := b.Put(seqKey(7), seqKey(uint64(len(name)*10))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, Options{})
	if err := s.AddWrites(ctx, []tokens.TokenWrites{{Resource: "a", Token: 7, N: 1}, {Resource: "a", Token: 8, N: 2}, {Resource: "b", Token: 7, N: 5}}); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[int64]uint64{"a": {7: 11, 8: 2}, "ab": {7: 20}, "b": {7: 5}}
	for r, counts := range want {
		got, err := s.Writes(ctx, r, []int64{6, 7, 8})
		if err != nil || len(got) != len(counts) {
			t.Fatalf("Writes(%s) = %v, %v; want %v", r, got, err, counts)
		}
		for tok, n := range counts {
			if got[tok] != n {
				t.Fatalf("Writes(%s) = %v, want %v", r, got, counts)
			}
		}
	}
	// A token maxCountedTokens past 7 drops the counts of 7 and 8 of "a"
	// only.
	far := int64(8 + maxCountedTokens)
	if err := s.AddWrites(ctx, []tokens.TokenWrites{{Resource: "a", Token: far, N: 1}}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Writes(ctx, "a", []int64{7, 8, far}); err != nil || len(got) != 1 || got[far] != 1 {
		t.Fatalf("Writes(a) after token %d = %v, %v; want only its count", far, got, err)
	}
	if got, err := s.Writes(ctx, "ab", []int64{7}); err != nil || got[7] != 20 {
		t.Fatalf("Writes(ab) = %v, %v; want its count untouched", got, err)
	}
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketWrites) != nil {
			return errors.New("the old write-count bucket is still there")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestHistoryMigrated opens a file with the history in one sub-bucket per
// resource (as written before bucketEvents) and wants the same history
// back, with new events following the old ones and the cap still kept.
func TestHistoryMigrated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegw.db")
	opts := Options{MaxHistoryPerResource: 5}
	s := openAt(t, path, opts)
	ctx := t.Context()
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	names := []string{"a", "ab", "b", "long/" + string(make([]byte, 200))}
	err := s.db.Update(func(tx *bbolt.Tx) error {
		old, err := tx.CreateBucketIfNotExists(bucketHistory) // it holds the layout guard
		if err != nil {
			return err
		}
		for i, name := range names {
			b, err := old.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			for seq := uint64(1); seq <= uint64(i+2); seq++ {
				ev := tokens.Event{At: at.Add(time.Duration(seq) * time.Second), Resource: name, Kind: tokens.EventGranted, Token: int64(seq), Holder: "old"}
				if err := b.Put(seqKey(seq), encodeEvent(&ev)); err != nil {
					return err
				}
				if _, err := b.NextSequence(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, opts)
	for i, name := range names {
		h, err := s.History(ctx, name, 0)
		if err != nil || len(h) != i+2 || h[0].Token != int64(i+2) || h[len(h)-1].Token != 1 || h[0].Resource != name {
			t.Fatalf("History(%.8q) after migration = %+v, %v; want tokens %d..1", name, h, err, i+2)
		}
	}
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if err := onlyLayoutGuard(tx); err != nil {
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// "b" had 4 events; three grants and releases make 10, the cap keeps 5.
	for range 3 {
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "b", Holder: "new", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Release(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	h, err := s.History(ctx, "b", 0)
	if err != nil || len(h) != 5 || h[0].Kind != tokens.EventReleased || h[4].Holder != "new" {
		t.Fatalf("History(b) = %+v, %v; want the 5 newest events, all new", h, err)
	}
	if h, err := s.History(ctx, "a", 0); err != nil || len(h) != 2 {
		t.Fatalf("History(a) = %d events, %v; want its 2, untouched by b's", len(h), err)
	}
}
