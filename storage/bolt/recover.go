package bolt

// Opening a file: the buckets and indexes it must have, and the drain after
// a crash (recover).

import (
	"bytes"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// recover creates the buckets (and the live-lease indexes of a file
// written before they existed), applies the crash drain if the previous
// process did not close the store, and clears the clean-shutdown marker.
func (s *Store) recover() error {
	err := s.db.Update(func(tx *bbolt.Tx) error {
		fresh := tx.Bucket(bucketMeta) == nil
		for _, name := range [][]byte{bucketMeta, bucketResources, bucketLeases, bucketRejections, bucketRejIndex, bucketRejRepeats, bucketEvents, bucketWriteCounts} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		noOwners := tx.Bucket(bucketOwnerLive) == nil
		if noOwners {
			if _, err := tx.CreateBucket(bucketOwnerLive); err != nil {
				return err
			}
		}
		switch {
		case tx.Bucket(bucketLive) == nil:
			if _, err := tx.CreateBucket(bucketLive); err != nil {
				return err
			}
			if err := buildLive(tx); err != nil { // both indexes
				return err
			}
		case noOwners:
			if err := buildOwners(tx); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		clean := meta.Get(keyClean) != nil
		// The marker is cleared now and written again by Close: if it is
		// missing at the next Open, this process did not shut down cleanly.
		if err := meta.Delete(keyClean); err != nil {
			return err
		}
		if fresh || clean || s.opts.CrashDrain < 0 {
			return nil
		}
		// The previous process died (kill -9, power loss, panic). It may
		// have forwarded writes whose outcome it never saw: the upstream
		// has them and may still apply them. Their shared locks died with
		// the process, so nothing would stop a new grant from fencing the
		// old holder while its write is still on the way. Every resource
		// whose lease was live, or ended (expired, or released: a release
		// does not wait for the writes in flight) so recently that a write
		// admitted just before the end may still be in flight or in its
		// drain, is closed to grants until now+CrashDrain, exactly as a
		// forward with an unknown outcome would have done. A write admitted
		// before the end is in flight for at most the forward timeout after
		// it, and a drain its store could not record holds its fence for a
		// drain period after that (tokens/drain.go): the horizon is both,
		// twice CrashDrain (the drain period, which is at least the forward
		// timeout unless the operator was warned otherwise). A lease that
		// ended before the horizon had its last write's drain end before
		// the restart, whenever the process died.
		now := s.now()
		horizon := now.Add(-2 * s.opts.CrashDrain)
		until := now.Add(s.opts.CrashDrain)
		res, leases := tx.Bucket(bucketResources), tx.Bucket(bucketLeases)
		type update struct {
			name []byte
			st   resState
		}
		var updates []update
		err := res.ForEach(func(k, v []byte) error {
			st, err := decodeResource(v)
			if err != nil {
				return fmt.Errorf("resource %q: %w", resourceKeyName(k), err)
			}
			if st.current == "" {
				return nil
			}
			lv := leases.Get(leaseKey(st.current))
			if lv == nil {
				return nil
			}
			l, err := decodeLease(st.current, lv)
			if err != nil {
				return fmt.Errorf("lease %s: %w", tokens.LeaseHint(st.current), err)
			}
			ended := l.ExpiresAt
			if l.Released() && l.ReleasedAt.Before(ended) {
				ended = l.ReleasedAt
			}
			if !ended.After(horizon) || !st.drainUntil.Before(until) {
				return nil
			}
			st.drainUntil = until
			updates = append(updates, update{bytes.Clone(k), st})
			return nil
		})
		if err != nil {
			return err
		}
		for _, u := range updates {
			if err := res.Put(u.name, encodeResource(&u.st)); err != nil {
				return err
			}
		}
		s.log.Warn("store was not closed cleanly; draining resources whose writes may still be in flight",
			"resources", len(updates), "drain", s.opts.CrashDrain)
		return nil
	})
	if err != nil {
		return tokens.Unavailable("recover store", err)
	}
	return nil
}
