package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

func getResource(tx *bbolt.Tx, name string) (resState, error) {
	v := tx.Bucket(bucketResources).Get([]byte(name))
	if v == nil {
		return resState{}, nil
	}
	st, err := decodeResource(v)
	if err != nil {
		return resState{}, fmt.Errorf("resource %q: %w", name, err)
	}
	return st, nil
}

func getLease(tx *bbolt.Tx, id string) (*tokens.Lease, error) {
	if id == "" {
		return nil, nil
	}
	v := tx.Bucket(bucketLeases).Get([]byte(id))
	if v == nil {
		return nil, nil
	}
	l, err := decodeLease(id, v)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", tokens.LeaseHint(id), err)
	}
	return &l, nil
}

func putLease(tx *bbolt.Tx, l *tokens.Lease) error {
	b := tx.Bucket(bucketLeases)
	b.FillPercent = leasesFill
	return b.Put([]byte(l.ID), encodeLease(l))
}

// leasesFill is where the leases bucket's pages split. Lease ids are
// time-ordered (tokens.NewLeaseID), so new leases are appended, and a page
// split half full (bbolt's default) would stay half full: no later id falls
// into it. 10% is left free for the records' own growth: a release adds
// ReleasedAt (8 bytes more), which a page of ~25 leases absorbs without a
// split.
const leasesFill = 0.9

func putResource(tx *bbolt.Tx, name string, st *resState) error {
	return tx.Bucket(bucketResources).Put([]byte(name), encodeResource(st))
}

func event(kind tokens.EventKind, at time.Time, l *tokens.Lease) tokens.Event {
	return tokens.Event{At: at, Resource: l.Resource, Kind: kind, Token: l.Token, Holder: l.Holder, ExpiresAt: l.ExpiresAt}
}

// bucketLive indexes the leases that may be live: for every resource whose
// current lease is not released, expiry (liveKey) -> lease id. CurrentLeases
// reads it from now on, in the order it returns, without holding every lease
// in memory or scanning every resource. Entries of expired leases are
// pruned a few at a time by the mutations (pruneLive).
var bucketLive = []byte("live_by_expiry")

// liveKey is the lease's expiry as offset-binary Unix nanoseconds (so that
// byte order is time order, before 1970 too) followed by its resource.
func liveKey(l *tokens.Lease) []byte {
	return append(liveTime(l.ExpiresAt), l.Resource...)
}

func liveTime(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8+32), uint64(unixNano(t))^(1<<63))
}

func indexLive(tx *bbolt.Tx, l *tokens.Lease) error {
	b := tx.Bucket(bucketLive)
	// Keys are mostly appended (expiries grow with the clock): pages split
	// at 90% instead of half full take ~40% less of the file.
	b.FillPercent = 0.9
	return b.Put(liveKey(l), []byte(l.ID))
}

func unindexLive(tx *bbolt.Tx, l *tokens.Lease) error {
	if l == nil {
		return nil
	}
	return tx.Bucket(bucketLive).Delete(liveKey(l))
}

// livePruneLag is how long after its expiry an entry stays in bucketLive: a
// little, so that a clock stepping back a bit still lists its live leases
// (only listing depends on the index, never a fence decision). Every second
// of it keeps a second of grants' entries: 5 s is ~30 B per resource at
// 5,000 grants/s with a 30 s TTL.
const livePruneLag = 5 * time.Second

// livePrunePerTx bounds the entries one mutation prunes. Each grant adds at
// most one entry, so pruning more than one per mutation keeps the index at
// the leases live within the lag.
const livePrunePerTx = 4

// pruneLive deletes up to livePrunePerTx entries that expired more than
// livePruneLag before now.
func pruneLive(tx *bbolt.Tx, now time.Time) error {
	horizon := liveTime(now.Add(-livePruneLag))
	c := tx.Bucket(bucketLive).Cursor()
	for range livePrunePerTx {
		k, _ := c.First()
		if k == nil || bytes.Compare(k[:min(len(k), 8)], horizon) >= 0 {
			return nil
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// buildLive fills bucketLive from the resources, for a file written before
// it existed.
func buildLive(tx *bbolt.Tx) error {
	res := tx.Bucket(bucketResources)
	return res.ForEach(func(k, v []byte) error {
		st, err := decodeResource(v)
		if err != nil {
			return fmt.Errorf("resource %q: %w", k, err)
		}
		l, err := getLease(tx, st.current)
		if err != nil || l == nil || l.Released() || l.Token != st.token {
			return err
		}
		return indexLive(tx, l)
	})
}
