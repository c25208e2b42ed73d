package bolt

// The per-owner index of live leases, by which a grant counts its owner's
// live leases against the owner's cap (tokens.GrantRequest.MaxLeases)
// inside the grant's own transaction. bbolt has one writer at a time, and
// the group commit runs its mutations one after another in one
// transaction, each seeing the ones before: the count and the new lease
// are one step, however many grants and gateways' requests arrive at once.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// bucketOwnerLive holds, for every lease that has an owner and is in
// bucketLive, ownerPrefix(owner) + liveKey -> nothing: the owner's leases
// that may be live, soonest expiry first. Entries go with bucketLive's
// (indexLive, unindexLive); expired ones are pruned a few at a time by the
// owner's own grants (pruneOwner), so that a count seeks past them.
var bucketOwnerLive = []byte("live_by_owner")

// ownerPrefix is the owner's name after its length, so that no owner's
// entries fall inside another's range.
func ownerPrefix(owner string) []byte {
	b := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(owner)+8+32), uint64(len(owner)))
	return append(b, owner...)
}

func ownerLiveKey(l *tokens.Lease) []byte {
	return append(ownerPrefix(l.Owner), liveKey(l)...)
}

func indexOwner(tx *bbolt.Tx, l *tokens.Lease) error {
	if l.Owner == "" {
		return nil
	}
	return tx.Bucket(bucketOwnerLive).Put(ownerLiveKey(l), nil)
}

func unindexOwner(tx *bbolt.Tx, l *tokens.Lease) error {
	if l == nil || l.Owner == "" {
		return nil
	}
	return tx.Bucket(bucketOwnerLive).Delete(ownerLiveKey(l))
}

// countOwner counts owner's live leases at now, up to limit: the index's
// entries that expire after now. The index is written in the same
// transactions as the leases it indexes, so it is trusted as it stands: a
// count walks keys only, without decoding a lease, because it runs inside
// the one writer's transaction that every grant, renewal and release of
// the store waits for. (A file written meanwhile by a version without the
// index would leave it out of date until its leases expire: a downgrade
// and an upgrade within a TTL.)
func countOwner(tx *bbolt.Tx, owner string, now time.Time, limit int) int {
	prefix := ownerPrefix(owner)
	c := tx.Bucket(bucketOwnerLive).Cursor()
	n := 0
	for k, _ := c.Seek(append(bytes.Clone(prefix), liveTime(now.Add(1))...)); k != nil && bytes.HasPrefix(k, prefix) && n < limit; k, _ = c.Next() {
		n++
	}
	return n
}

// pruneOwner deletes up to livePrunePerTx of owner's entries that expired
// more than livePruneLag before now. Each of the owner's grants adds one
// entry at most, so the owner's entries stay those live within the lag,
// plus those of the resources it last held.
func pruneOwner(tx *bbolt.Tx, owner string, now time.Time) error {
	if owner == "" {
		return nil
	}
	prefix := ownerPrefix(owner)
	horizon := append(bytes.Clone(prefix), liveTime(now.Add(-livePruneLag))...)
	c := tx.Bucket(bucketOwnerLive).Cursor()
	k, _ := c.Seek(prefix)
	for range livePrunePerTx {
		if k == nil || !bytes.HasPrefix(k, prefix) || bytes.Compare(k, horizon) >= 0 {
			return nil
		}
		if err := c.Delete(); err != nil {
			return err
		}
		// After a Delete the cursor stands on the next entry (bbolt moves it
		// there), which Seek finds again without relying on that.
		k, _ = c.Seek(prefix)
	}
	return nil
}

// buildOwners fills bucketOwnerLive from bucketLive's leases, for a file
// written before it existed.
func buildOwners(tx *bbolt.Tx) error {
	return forEachLive(tx, indexOwner)
}

// forEachLive calls fn for the current unreleased lease of every resource.
func forEachLive(tx *bbolt.Tx, fn func(tx *bbolt.Tx, l *tokens.Lease) error) error {
	return tx.Bucket(bucketResources).ForEach(func(k, v []byte) error {
		st, err := decodeResource(v)
		if err != nil {
			return fmt.Errorf("resource %q: %w", resourceKeyName(k), err)
		}
		l, err := getLease(tx, st.current)
		if err != nil || l == nil || l.Released() || l.Token != st.token {
			return err
		}
		return fn(tx, l)
	})
}
