package bolt

import (
	"context"
	"encoding/binary"

	"go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// bucketWrites holds forwarded-write counts: one sub-bucket per resource,
// token (8 bytes, big-endian) -> count (8 bytes). Created on first use.
var bucketWrites = []byte("write_counts")

// maxCountedTokens is how many of a resource's newest tokens keep their
// counts; older ones are dropped as new ones are counted (the lease
// history keeps MaxHistoryPerResource events, fewer grants than this).
const maxCountedTokens = 4096

var _ tokens.WriteCounter = (*Store)(nil)

// AddWrites implements tokens.WriteCounter in one batched transaction.
func (s *Store) AddWrites(ctx context.Context, batch []tokens.TokenWrites) error {
	if len(batch) == 0 {
		return nil
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave()
	return s.update("add writes", func(tx *bbolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(bucketWrites)
		if err != nil {
			return err
		}
		for _, w := range batch {
			b, err := root.CreateBucketIfNotExists([]byte(w.Resource))
			if err != nil {
				return err
			}
			key := seqKey(uint64(w.Token))
			n := w.N
			if v := b.Get(key); len(v) == 8 {
				n += binary.BigEndian.Uint64(v)
			}
			if err := b.Put(key, binary.BigEndian.AppendUint64(nil, n)); err != nil {
				return err
			}
			// Drop the counts of tokens far older than this one.
			c := b.Cursor()
			for k, _ := c.First(); k != nil && w.Token > maxCountedTokens && int64(binary.BigEndian.Uint64(k)) <= w.Token-maxCountedTokens; k, _ = c.First() {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Writes implements tokens.WriteCounter.
func (s *Store) Writes(ctx context.Context, resource string, toks []int64) (map[int64]uint64, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	out := map[int64]uint64{}
	err := s.db.View(func(tx *bbolt.Tx) error {
		root := tx.Bucket(bucketWrites)
		if root == nil {
			return nil
		}
		b := root.Bucket([]byte(resource))
		if b == nil {
			return nil
		}
		for _, t := range toks {
			if v := b.Get(seqKey(uint64(t))); len(v) == 8 {
				out[t] = binary.BigEndian.Uint64(v)
			}
		}
		return nil
	})
	if err != nil {
		return nil, tokens.Unavailable("writes", err)
	}
	return out, nil
}
