package bolt

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// bucketLeafUse is the share of bucket's leaf pages in use.
func bucketLeafUse(t *testing.T, s *Store, bucket []byte) float64 {
	t.Helper()
	var st bbolt.BucketStats
	if err := s.db.View(func(tx *bbolt.Tx) error {
		st = tx.Bucket(bucket).Stats()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return float64(st.LeafInuse) / float64(st.LeafPageN*s.db.Info().PageSize)
}

// grantNames grants name(0..n-1) once each, in that order, one at a time:
// each grant is then a commit of its own, whose new keys are all past the
// bucket's last or not, by the order of the names alone. (Concurrent
// grants share commits, and a commit that shares a round of names with an
// earlier one can hold keys below that one's: the split would then depend
// on the scheduler, and a loaded machine failed this test that way.)
func grantNames(t *testing.T, s *Store, n int, name func(int) string) {
	t.Helper()
	for i := range n {
		if _, err := s.Grant(t.Context(), tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: name(i), Holder: "h", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAppendedBucketsSplitFull: resource names that count up (whatever
// their number of digits) are appended to the resource states and to the
// history, whose pages then split (nearly) full; the same names in a
// scattered order land in the middle of both, whose pages then split half
// full, as bbolt does by default: splitting those at 90 % would leave them
// ~40 % used (a page split 90/10 splits again at its next insert).
func TestAppendedBucketsSplitFull(t *testing.T) {
	const n = 3000 // ~50 pages of resource states
	seq := func(i int) string { return fmt.Sprintf("job/%d", i+1) }
	s := openAt(t, filepath.Join(t.TempDir(), "seq.db"), Options{})
	grantNames(t, s, n, seq)
	for _, b := range [][]byte{bucketResources, bucketEvents} {
		if got := bucketLeafUse(t, s, b); got < 0.85 {
			t.Errorf("names in order: bucket %s's leaf pages are %.0f%% used, want >= 85%%", b, 100*got)
		}
	}
	r := openAt(t, filepath.Join(t.TempDir(), "scattered.db"), Options{})
	grantNames(t, r, n, func(i int) string { return seq(i * 1999 % n) }) // 1999 is prime: a permutation
	for _, b := range [][]byte{bucketResources, bucketEvents} {
		if got := bucketLeafUse(t, r, b); got < 0.55 || got > 0.85 {
			t.Errorf("names scattered: bucket %s's leaf pages are %.0f%% used, want 55-85%% (split half full)", b, 100*got)
		}
	}
}
