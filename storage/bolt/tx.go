package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// Resource states are keyed by resourcePrefix(name): the name after its
// length. Names that count up (job/1, job/2, ..., job/10, ...) are then in
// key order as they arrive, whatever their number of digits, so their keys
// are appended and the pages they fill can be split full (fillTracker).
// Files written before kept the bare name as the key in bucketResourcesByName;
// Open moves them over (migrateResources).
var bucketResourcesByName = []byte("resources")

func getResource(tx *bbolt.Tx, name string) (resState, error) {
	st, _, err := findResource(tx, name)
	return st, err
}

// findResource is getResource, and whether the file has a state for name.
func findResource(tx *bbolt.Tx, name string) (st resState, found bool, err error) {
	v := tx.Bucket(bucketResources).Get(resourcePrefix(name))
	if v == nil {
		return resState{}, false, nil
	}
	if st, err = decodeResource(v); err != nil {
		return resState{}, true, fmt.Errorf("resource %q: %w", name, err)
	}
	return st, true, nil
}

func getLease(tx *bbolt.Tx, id string) (*tokens.Lease, error) {
	if id == "" {
		return nil, nil
	}
	v := tx.Bucket(bucketLeases).Get(leaseKey(id))
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
	return putLeaseAt(tx, leaseKey(l.ID), l)
}

// putLeaseAt is putLease with l's key, leaseKey(l.ID), already made.
func putLeaseAt(tx *bbolt.Tx, key []byte, l *tokens.Lease) error {
	b := tx.Bucket(bucketLeases)
	b.FillPercent = leasesFill
	return b.Put(key, encodeLease(l))
}

// Leases are keyed by leaseKey(id): a time-ordered id (tokens.NewLeaseID)
// packed into 27 bytes (packLeaseID), any other id (those made before ids
// were time-ordered, "fl_" and 32 random characters) after a 0xff byte,
// which no packed id starts with. Packed keys sort in time order, before
// the others. Files written before kept the id itself as the key, in
// bucketLeasesByID; Open moves them over (migrateLeases).
var bucketLeasesByID = []byte("leases")

const otherLeaseKey = 0xff

func leaseKey(id string) []byte {
	if p, ok := packLeaseID(id); ok {
		return p[:]
	}
	return append(append(make([]byte, 0, 1+len(id)), otherLeaseKey), id...)
}

// leaseKeyID is the lease id of a key made by leaseKey.
func leaseKeyID(k []byte) (string, error) {
	switch {
	case len(k) > 0 && k[0] == otherLeaseKey:
		return string(k[1:]), nil
	case len(k) == packedLeaseIDLen:
		return unpackLeaseID(k), nil
	}
	return "", fmt.Errorf("lease key %x: %w", k, errCorrupt)
}

// leasesFill is where the leases bucket's pages split. Lease ids are
// time-ordered (tokens.NewLeaseID), so new leases are appended, and a page
// split half full (bbolt's default) would stay half full: no later id falls
// into it. 10% is left free for the records' own growth: a release adds
// ReleasedAt (8 bytes more), which a page of ~25 leases absorbs without a
// split.
const leasesFill = 0.9

func (s *Store) putResource(tx *bbolt.Tx, name string, st *resState) error {
	b := tx.Bucket(bucketResources)
	k := resourcePrefix(name)
	s.fills.noteKey(b, &s.fills.res, k, fillAppendedStates)
	return b.Put(k, encodeResource(st))
}

// putNewResource is putResource for a name the file has no state for
// (findResource said so in this transaction): its key needs no lookup to
// be known new.
func (s *Store) putNewResource(tx *bbolt.Tx, name string, st *resState) error {
	b := tx.Bucket(bucketResources)
	k := resourcePrefix(name)
	s.fills.noteNewKey(b, &s.fills.res, k, fillAppendedStates)
	return b.Put(k, encodeResource(st))
}

// Where the pages of a bucket whose new keys are often appended (resource
// states, the lease history) split, set per transaction (fillTracker). A
// page split half full (bbolt's default) stays half full when every later
// key lands to its right, as appended keys do; split full it stays full:
// history events never change once written, so their pages are filled
// whole, and a resource state grows by 8 bytes when drained, so 5 % of its
// pages is left free. But a page split full that later takes keys in its
// middle splits again soon, into a full page and a nearly empty one: with
// keys inserted in random places, pages split at 90 % end ~40 % used on
// average, against ~70 % with the default (a simulation of random inserts
// into 54-entry pages; TestAppendedBucketsSplitFull measures both). So a
// transaction splits full only if every new key it put in the bucket is
// past the bucket's last key as the transaction found it.
const (
	fillAppendedEvents = 1.0
	fillAppendedStates = 0.95
	// fillAppended is for keys moved over in order at open (migrateRekeyed).
	fillAppended = 0.9
	// fillInserted is bbolt's default, 0.5, nudged up so that it can be
	// told from a Bucket's initial FillPercent: once a transaction put a key
	// in a bucket's middle, appends later in it no longer raise the fill.
	fillInserted = bbolt.DefaultFillPercent + 0.01
)

// fillTracker keeps, for the write transaction running (bbolt runs one at
// a time), each tracked bucket's last key as the transaction found it.
// Only write transactions use it, and bbolt's writer lock orders them.
type fillTracker struct {
	res, events fillSlot
}

type fillSlot struct {
	// b and txid name the bucket and transaction the slot is for: a
	// Bucket of a later transaction may be allocated at the address of an
	// earlier one, and a rolled-back transaction's id is reused.
	b    *bbolt.Bucket
	txid int
	last []byte // its last key before the transaction's first new key
}

// noteKey is called before k is put in b: if k is new, it sets b's split
// point for this transaction (appended while every new key was past the
// bucket's last, fillInserted once one was not).
func (f *fillTracker) noteKey(b *bbolt.Bucket, slot *fillSlot, k []byte, appended float64) {
	if b.FillPercent == fillInserted {
		return // decided for this transaction
	}
	if got, _ := b.Cursor().Seek(k); got != nil && bytes.Equal(got, k) {
		return // replaces a value: no new key
	}
	f.noteNewKey(b, slot, k, appended)
}

// noteNewKey is noteKey for a k known not to be in b: the seek that would
// tell is one of the few lookups a grant makes in the committer's
// transaction.
func (f *fillTracker) noteNewKey(b *bbolt.Bucket, slot *fillSlot, k []byte, appended float64) {
	if b.FillPercent == fillInserted {
		return // decided for this transaction
	}
	if slot.b != b || slot.txid != b.Tx().ID() { // the transaction's first new key in b
		slot.b, slot.txid = b, b.Tx().ID()
		last, _ := b.Cursor().Last()
		slot.last = bytes.Clone(last)
	}
	if slot.last == nil || bytes.Compare(k, slot.last) > 0 {
		b.FillPercent = appended
	} else {
		b.FillPercent = fillInserted
	}
}

func event(kind tokens.EventKind, at time.Time, l *tokens.Lease) tokens.Event {
	return tokens.Event{At: at, Resource: l.Resource, Kind: kind, Token: l.Token, Holder: l.Holder, ExpiresAt: l.ExpiresAt}
}

// bucketLive indexes the leases that may be live: for every resource whose
// current lease is not released, expiry (liveKey) -> nothing. The lease is
// the resource's current one: CurrentLeases finds it through the resource
// state, so the index holds no copy of its id (entries written before hold
// the id as their value, and are read through it). CurrentLeases
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

// indexLive indexes l in bucketLive and, if it has an owner, in
// bucketOwnerLive.
func indexLive(tx *bbolt.Tx, l *tokens.Lease) error {
	b := tx.Bucket(bucketLive)
	// Keys are mostly appended (expiries grow with the clock): pages split
	// at 90% instead of half full take ~40% less of the file.
	b.FillPercent = 0.9
	if err := b.Put(liveKey(l), nil); err != nil {
		return err
	}
	return indexOwner(tx, l)
}

func unindexLive(tx *bbolt.Tx, l *tokens.Lease) error {
	if l == nil {
		return nil
	}
	if err := tx.Bucket(bucketLive).Delete(liveKey(l)); err != nil {
		return err
	}
	return unindexOwner(tx, l)
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

// buildLive fills bucketLive (and bucketOwnerLive) from the resources, for
// a file written before it existed.
func buildLive(tx *bbolt.Tx) error {
	return forEachLive(tx, indexLive)
}
