package bolt

// The collector of ended leases: an hourly pass that deletes, in chunks,
// the leases that ended more than LeaseRetention ago.

import (
	"bytes"
	"context"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// gcInterval is how often ended leases are garbage-collected.
const gcInterval = time.Hour

// gcChunk is how many leases one collecting transaction deletes at most:
// the scan and the deletes go in chunks so that neither a transaction nor
// the list of candidates grows with the file.
const gcChunk = 1000

func (s *Store) gcLoop() {
	defer close(s.gcDone)
	t := time.NewTicker(gcInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopGC:
			return
		case <-t.C:
			if n, err := s.collectLeases(); err != nil {
				s.log.Error("lease garbage collection failed", "err", err)
			} else if n > 0 {
				s.log.Info("garbage-collected ended leases", "leases", n)
			}
		}
	}
}

// collectLeases deletes leases that are not their resource's current lease
// and ended (expired or released) more than LeaseRetention ago. Such a lease
// can never become live again; after collection its id is unknown
// (ErrNotFound, so a late write under it is refused as unknown_lease rather
// than stale_token). The current lease of a resource is always kept, since
// Resource reports it.
func (s *Store) collectLeases() (int, error) {
	horizon := s.now().Add(-LeaseRetention)
	total := 0
	var after []byte // the scan resumes past this lease id
	for {
		var candidates []string
		if err := s.enter(context.Background()); err != nil {
			return total, err
		}
		err := s.db.View(func(tx *bbolt.Tx) error {
			c := tx.Bucket(bucketLeases).Cursor()
			k, v := c.First()
			if after != nil {
				if k, v = c.Seek(after); k != nil && bytes.Equal(k, after) {
					k, v = c.Next()
				}
			}
			for ; k != nil && len(candidates) < gcChunk; k, v = c.Next() {
				after = bytes.Clone(k)
				id, err := leaseKeyID(k)
				if err != nil {
					continue // left for an operator to see, as below
				}
				l, err := decodeLease(id, v)
				if err != nil || !ended(&l).Before(horizon) {
					continue // an unreadable lease is left for an operator to see
				}
				if st, err := getResource(tx, l.Resource); err == nil && st.current != l.ID {
					candidates = append(candidates, l.ID)
				}
			}
			if k == nil {
				after = nil
			}
			return nil
		})
		if err != nil {
			s.leave()
			return total, tokens.Unavailable("collect leases", err)
		}
		var deleted []string
		if len(candidates) > 0 {
			err = s.db.Update(func(tx *bbolt.Tx) error {
				deleted = deleted[:0]
				for _, id := range candidates {
					// Re-check against the persisted state: the decision and
					// the delete are one transaction.
					l, err := getLease(tx, id)
					if err != nil || l == nil || !ended(l).Before(horizon) {
						continue
					}
					st, err := getResource(tx, l.Resource)
					if err != nil || st.current == id {
						continue
					}
					if err := tx.Bucket(bucketLeases).Delete(leaseKey(id)); err != nil {
						return err
					}
					deleted = append(deleted, id)
				}
				return nil
			})
		}
		s.leave()
		if err != nil {
			return total, tokens.Unavailable("collect leases", err)
		}
		if len(deleted) > 0 {
			s.cache.dropLeases(deleted)
		}
		total += len(deleted)
		if after == nil {
			return total, nil
		}
	}
}

func ended(l *tokens.Lease) time.Time {
	if l.Released() && l.ReleasedAt.Before(l.ExpiresAt) {
		return l.ReleasedAt
	}
	return l.ExpiresAt
}
