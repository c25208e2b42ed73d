package bolt

import (
	"bytes"
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
	return tx.Bucket(bucketLeases).Put([]byte(l.ID), encodeLease(l))
}

func putResource(tx *bbolt.Tx, name string, st *resState) error {
	return tx.Bucket(bucketResources).Put([]byte(name), encodeResource(st))
}

// addEvent appends to the resource's history and drops the oldest events
// beyond the cap.
func (s *Store) addEvent(tx *bbolt.Tx, ev tokens.Event) error {
	b, err := tx.Bucket(bucketHistory).CreateBucketIfNotExists([]byte(ev.Resource))
	if err != nil {
		return err
	}
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	if err := b.Put(seqKey(seq), encodeEvent(&ev)); err != nil {
		return err
	}
	limit := uint64(s.opts.MaxHistoryPerResource)
	if seq <= limit {
		return nil
	}
	// Sequences have no gaps except at the front, so everything at or
	// below seq-limit is beyond the cap; usually that is one event.
	var old [][]byte
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n, ok := keySeq(k)
		if ok && n > seq-limit {
			break
		}
		old = append(old, bytes.Clone(k))
	}
	for _, k := range old {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

func event(kind tokens.EventKind, at time.Time, l *tokens.Lease) tokens.Event {
	return tokens.Event{At: at, Resource: l.Resource, Kind: kind, Token: l.Token, Holder: l.Holder, ExpiresAt: l.ExpiresAt}
}
