package bolt

import (
	"bytes"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// The layout migrations: a file written by an older version is moved to
// the current layout at Open, in chunks (migrateInChunks), and marked with
// layoutGuard so that older versions refuse it.

// migrateChunk is how many resources' sub-buckets one migrating
// transaction moves, so that a large file is not moved in one transaction
// held in memory.
const migrateChunk = 10_000

// migrateHistory moves the lease history and the write counts of a file
// written before bucketEvents and bucketWriteCounts into them.
func (s *Store) migrateHistory() error {
	if err := s.migrateSubBuckets(bucketHistory, bucketEvents, "lease history"); err != nil {
		return err
	}
	return s.migrateSubBuckets(bucketWrites, bucketWriteCounts, "write counts")
}

// migrateInChunks runs chunk in one write transaction after another until
// it reports done: a migration of a large file is not held in memory in one
// transaction, and each chunk is copied and deleted in one, so a crash
// midway leaves nothing twice. n is what a chunk moved, for the log line.
func (s *Store) migrateInChunks(what, layout string, chunk func(tx *bbolt.Tx) (n int, done bool, err error)) error {
	moved := 0
	for {
		var n int
		var done bool
		err := s.db.Update(func(tx *bbolt.Tx) error {
			var err error
			n, done, err = chunk(tx)
			return err
		})
		if err != nil {
			return tokens.Unavailable("migrate "+what, err)
		}
		moved += n
		if done {
			if moved > 0 {
				s.log.Info("moved to the "+layout+" layout", "what", what, "moved", moved)
			}
			return nil
		}
	}
}

// migrateSubBuckets moves every sub-bucket of old (resource -> n -> value,
// n 8 big-endian bytes) into to as resourceKey(resource, n) -> value, a
// chunk of resources per transaction, and drops old at the end (unless it
// holds the layout guard, which stays).
func (s *Store) migrateSubBuckets(oldName, toName []byte, what string) error {
	return s.migrateInChunks(what, "one-bucket", func(tx *bbolt.Tx) (int, bool, error) {
		old := tx.Bucket(oldName)
		if old == nil {
			return 0, true, nil
		}
		to := tx.Bucket(toName)
		var names [][]byte
		c := old.Cursor()
		guarded := false
		for k, v := c.First(); k != nil && len(names) < migrateChunk; k, v = c.Next() {
			if v != nil {
				continue // not a sub-bucket: nothing ever wrote one
			}
			if bytes.Equal(k, layoutGuard) {
				guarded = true
				continue
			}
			names = append(names, bytes.Clone(k))
		}
		if len(names) == 0 {
			if guarded {
				return 0, true, nil
			}
			return 0, true, tx.DeleteBucket(oldName)
		}
		for _, name := range names {
			err := old.Bucket(name).ForEach(func(k, v []byte) error {
				n, ok := keySeq(k)
				if !ok {
					return fmt.Errorf("%s of %q: key %x: %w", what, name, k, errCorrupt)
				}
				return to.Put(resourceKey(string(name), n), bytes.Clone(v))
			})
			if err != nil {
				return 0, false, err
			}
			if err := old.DeleteBucket(name); err != nil {
				return 0, false, err
			}
		}
		return len(names), false, nil
	})
}

// migrateResources moves the resource states of a file written before
// bucketResources (keyed by the bare name, in bucketResourcesByName) over.
// It runs before recover, which reads the states.
func (s *Store) migrateResources() error {
	return s.migrateRekeyed(bucketResourcesByName, bucketResources, "resource states",
		func(k []byte) []byte { return resourcePrefix(string(k)) })
}

// migrateLeases moves the leases of a file written before bucketLeases
// (keyed by the id itself, in bucketLeasesByID) over.
func (s *Store) migrateLeases() error {
	return s.migrateRekeyed(bucketLeasesByID, bucketLeases, "leases",
		func(k []byte) []byte { return leaseKey(string(k)) })
}

// migrateRekeyed moves every record of bucket old into bucket to under
// rekey(its key), a chunk per transaction, and drops old at the end.
func (s *Store) migrateRekeyed(oldName, toName []byte, what string, rekey func([]byte) []byte) error {
	return s.migrateInChunks(what, "compact", func(tx *bbolt.Tx) (int, bool, error) {
		old := tx.Bucket(oldName)
		if old == nil {
			return 0, true, nil
		}
		to, err := tx.CreateBucketIfNotExists(toName)
		if err != nil {
			return 0, false, err
		}
		to.FillPercent = fillAppended // old's order is mostly to's
		var keys [][]byte
		c := old.Cursor()
		for k, v := c.First(); k != nil && len(keys) < migrateChunk; k, v = c.Next() {
			if v == nil {
				return 0, false, fmt.Errorf("%s: %q is a bucket, not a record: %w", what, k, errCorrupt)
			}
			if err := to.Put(rekey(k), bytes.Clone(v)); err != nil {
				return 0, false, err
			}
			keys = append(keys, bytes.Clone(k))
		}
		if len(keys) == 0 {
			return 0, true, tx.DeleteBucket(oldName)
		}
		for _, k := range keys {
			if err := old.Delete(k); err != nil {
				return 0, false, err
			}
		}
		return len(keys), false, nil
	})
}

// layoutGuard keeps versions older than the compact layout (resource states
// and leases under new keys in new buckets, codec version 5) from opening a
// file that has it: they would find none of its resources and start every
// token again at 1. Those versions move the sub-buckets of bucketHistory
// into bucketEvents at open, and fail on a key that is not a sequence
// number; the guard is such a sub-bucket, which this version leaves alone.
var layoutGuard = []byte("fencegw: this file has the compact layout (2026-12); open it with that version of fencegw or a newer one")

// putLayoutGuard puts layoutGuard in place, if it is not there yet.
func putLayoutGuard(tx *bbolt.Tx) error {
	h, err := tx.CreateBucketIfNotExists(bucketHistory)
	if err != nil {
		return err
	}
	if h.Bucket(layoutGuard) != nil {
		return nil
	}
	g, err := h.CreateBucket(layoutGuard)
	if err != nil {
		return err
	}
	return g.Put([]byte("newer"), []byte{1})
}
