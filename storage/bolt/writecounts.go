package bolt

// Forwarded-write counts per resource and token (tokens.WriteCounter), in
// their own bucket.

import (
	"context"
	"encoding/binary"

	"go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// bucketWriteCounts holds forwarded-write counts: resourceKey(resource,
// token) -> count (8 bytes, big-endian), so one resource's counts are
// contiguous and in token order. Files written before it kept one
// sub-bucket per resource in bucketWrites (token -> count), ~100 bytes of
// bucket headers per resource written under; Open moves them over.
var (
	bucketWriteCounts = []byte("writes")
	bucketWrites      = []byte("write_counts")
)

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
	c := &call{fn: func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketWriteCounts)
		for _, w := range batch {
			key := resourceKey(w.Resource, uint64(w.Token))
			n := w.N
			if v := b.Get(key); len(v) == 8 {
				n += binary.BigEndian.Uint64(v)
			}
			if err := b.Put(key, binary.BigEndian.AppendUint64(nil, n)); err != nil {
				return err
			}
			if w.Token <= maxCountedTokens {
				continue
			}
			// Drop the counts of tokens far older than this one.
			prefix := resourcePrefix(w.Resource)
			c := b.Cursor()
			for k, _ := c.Seek(prefix); ; k, _ = c.Seek(prefix) {
				t, ok := resourceKeyN(prefix, k)
				if !ok || int64(t) > w.Token-maxCountedTokens {
					break
				}
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		return nil
	}}
	return s.update(ctx, "add writes", c, func(error) { s.leave() })
}

// Writes implements tokens.WriteCounter.
func (s *Store) Writes(ctx context.Context, resource string, toks []int64) (map[int64]uint64, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	out := map[int64]uint64{}
	err := s.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketWriteCounts)
		for _, t := range toks {
			if v := b.Get(resourceKey(resource, uint64(t))); len(v) == 8 {
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
