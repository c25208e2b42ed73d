package bolt

// The rejection log: RecordRejection (repeats counted on one entry), its
// pruning to the bound, and Rejections.

import (
	"bytes"
	"context"
	"fmt"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// rejectionGap is the shortest time from the start of one commit to that
// of a commit of rejections alone (groupCommit's lazy calls). A storm of
// refused writes would otherwise commit (and fsync) every few
// milliseconds, taking the single bbolt writer from grants and a quarter
// of the gateway's CPU per refusal; with the gap it commits at most ~50
// times a second whatever the rate. A lone rejection after a quiet spell
// is committed at once, and rejections share any commit a grant starts.
const rejectionGap = 20 * time.Millisecond

// RecordRejection implements tokens.Store. Rejections are committed in
// groups (the store's group commit: one bbolt transaction and one fsync
// per batch); the caller returns once its entry is durable, or when ctx
// ends (a queued entry is committed all the same).
func (s *Store) RecordRejection(ctx context.Context, r tokens.Rejection) (tokens.Rejection, error) {
	// Entered until the entry's commit has ended, so that Close finds
	// none left to write.
	if err := s.enter(ctx); err != nil {
		return tokens.Rejection{}, err
	}
	var out tokens.Rejection
	c := &call{lazy: true, fn: func(tx *bbolt.Tx) error {
		var err error
		out, err = s.insertRejection(tx, r)
		return err
	}}
	if err := s.update(ctx, "record rejection", c, func(error) { s.leave() }); err != nil {
		return tokens.Rejection{}, err
	}
	return out, nil
}

// insertRejection appends r to the log in tx and keeps the log bounded, or
// counts it on the latest entry with its RepeatKey (bucketRejRepeats) if
// that entry is still in the log. Its time is r.At if set, else the
// store's clock. The check and the count are in the one writer
// transaction, so no repeat is lost or counted twice.
func (s *Store) insertRejection(tx *bbolt.Tx, r tokens.Rejection) (tokens.Rejection, error) {
	log := tx.Bucket(bucketRejections)
	if r.At.IsZero() {
		r.At = s.now()
	}
	r.Repeats, r.FirstAt = max(r.Repeats, 1), r.At
	repeatKey, keyed := r.RepeatKey()
	repeats := tx.Bucket(bucketRejRepeats)
	if keyed {
		if k := repeats.Get([]byte(repeatKey)); k != nil {
			if v := log.Get(k); v != nil {
				id, _ := keySeq(k)
				prev, err := decodeRejection(int64(id), v)
				if err == nil {
					r.ID, r.Repeats, r.FirstAt = prev.ID, prev.Repeats+r.Repeats, prev.FirstAt
					return r, log.Put(bytes.Clone(k), encodeRejection(&r))
				}
			}
		}
	}
	id, err := log.NextSequence()
	if err != nil {
		return r, err
	}
	r.ID = int64(id)
	key := seqKey(id)
	if err := log.Put(key, encodeRejection(&r)); err != nil {
		return r, err
	}
	if keyed {
		if err := repeats.Put([]byte(repeatKey), key); err != nil {
			return r, err
		}
	}
	// A write with an unknown lease has no resource, and bbolt has no
	// bucket with an empty name: such entries are only in the main log.
	if r.Resource != "" {
		idx, err := tx.Bucket(bucketRejIndex).CreateBucketIfNotExists([]byte(r.Resource))
		if err != nil {
			return r, err
		}
		if err := idx.Put(key, nil); err != nil {
			return r, err
		}
	}
	return r, s.pruneRejections(tx, id)
}

// pruneRejections keeps the log within MaxRejections. IDs come from the
// bucket's sequence in the same transaction as the insert and only the
// oldest are ever deleted, so the log is the contiguous range
// [first, last] and its length is last-first+1. Checking every interval
// inserts and pruning down to MaxRejections-interval+1 keeps it at or below
// MaxRejections at every commit, at the cost of one cursor seek per
// interval inserts.
func (s *Store) pruneRejections(tx *bbolt.Tx, last uint64) error {
	limit := uint64(s.opts.MaxRejections)
	interval := min(max(limit/16, 1), 1024)
	if last%interval != 0 {
		return nil
	}
	target := limit - interval + 1 // entries to keep
	log, index := tx.Bucket(bucketRejections), tx.Bucket(bucketRejIndex)
	c := log.Cursor()
	k, v := c.First()
	type victim struct {
		key       []byte
		resource  []byte
		repeatKey []byte
	}
	var victims []victim
	for ; k != nil; k, v = c.Next() {
		first, ok := keySeq(k)
		if !ok || last-first+1 <= target {
			break
		}
		r, err := decodeRejection(int64(first), v)
		if err != nil {
			// Drop it anyway: an unreadable entry would otherwise stay
			// forever and stop retention. Its index entry, if any, is
			// skipped by readers since the entry is gone.
			victims = append(victims, victim{key: bytes.Clone(k)})
			continue
		}
		vc := victim{key: bytes.Clone(k), resource: []byte(r.Resource)}
		if rk, ok := r.RepeatKey(); ok {
			vc.repeatKey = []byte(rk)
		}
		victims = append(victims, vc)
	}
	repeats := tx.Bucket(bucketRejRepeats)
	for _, vc := range victims {
		if err := log.Delete(vc.key); err != nil {
			return err
		}
		if vc.repeatKey != nil && bytes.Equal(repeats.Get(vc.repeatKey), vc.key) {
			if err := repeats.Delete(vc.repeatKey); err != nil {
				return err
			}
		}
		if vc.resource == nil {
			continue
		}
		if b := index.Bucket(vc.resource); b != nil {
			if err := b.Delete(vc.key); err != nil {
				return err
			}
			if k, _ := b.Cursor().First(); k == nil {
				if err := index.DeleteBucket(vc.resource); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Rejections implements tokens.Store: newest first, Before exclusive, limit
// defaulting to 100 and capped at 1000. A resource filter reads only that
// resource's index. Since stops the scan at the first older entry: entries
// are in recording order, and their times are the store's clock at
// recording (unless the caller set At).
func (s *Store) Rejections(ctx context.Context, q tokens.RejectionQuery) ([]tokens.Rejection, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	limit := clampLimit(q.Limit)
	out := make([]tokens.Rejection, 0, min(limit, 16))
	err := s.db.View(func(tx *bbolt.Tx) error {
		log := tx.Bucket(bucketRejections)
		var c *bbolt.Cursor
		if q.Resource != "" {
			idx := tx.Bucket(bucketRejIndex).Bucket([]byte(q.Resource))
			if idx == nil {
				return nil
			}
			c = idx.Cursor()
		} else {
			c = log.Cursor()
		}
		var k []byte
		if q.Before > 0 {
			if k, _ = c.Seek(seqKey(uint64(q.Before))); k == nil {
				k, _ = c.Last()
			} else {
				k, _ = c.Prev()
			}
		} else {
			k, _ = c.Last()
		}
		for ; k != nil && len(out) < limit; k, _ = c.Prev() {
			id, ok := keySeq(k)
			if !ok {
				return fmt.Errorf("rejection key %x: %w", k, errCorrupt)
			}
			if q.Before > 0 && id >= uint64(q.Before) {
				continue
			}
			v := log.Get(k)
			if v == nil {
				continue // pruned
			}
			r, err := decodeRejection(int64(id), v)
			if err != nil {
				return fmt.Errorf("rejection %d: %w", id, err)
			}
			if !q.Since.IsZero() && r.At.Before(q.Since) {
				break
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, tokens.Unavailable("list rejections", err)
	}
	return out, nil
}
