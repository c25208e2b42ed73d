package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// The lease history is one bucket, bucketEvents, keyed by resource and a
// per-resource sequence (resourceKey), so a resource's events are
// contiguous and in order. Files written before it kept one sub-bucket per
// resource in bucketHistory; a sub-bucket costs ~100 bytes of headers even
// inline, which for a resource granted once was two thirds of its history's
// share of the file (see docs/benchmarks.md, "Memory"). Open moves such
// history over (migrateHistory).

// bucketHistory is the history bucket of files written before bucketEvents:
// one sub-bucket per resource, seq -> event.
var bucketHistory = []byte("history")

// resourceKey is resource, length-prefixed so that no resource's keys fall
// inside another's, followed by n as 8 big-endian bytes.
func resourceKey(resource string, n uint64) []byte {
	k := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(resource)+8), uint64(len(resource)))
	k = append(k, resource...)
	return binary.BigEndian.AppendUint64(k, n)
}

// resourceKeyN returns the n of a key of prefix's resource.
func resourceKeyN(prefix, k []byte) (uint64, bool) {
	if len(k) != len(prefix)+8 || !bytes.HasPrefix(k, prefix) {
		return 0, false
	}
	return binary.BigEndian.Uint64(k[len(prefix):]), true
}

// resourceKeyName is the resource name of a key made by resourcePrefix (or
// resourceKey), for messages: the bytes after the length.
func resourceKeyName(k []byte) string {
	n, w := binary.Uvarint(k)
	if w <= 0 || uint64(len(k)-w) < n {
		return string(k)
	}
	return string(k[w : w+int(n)])
}

// resourcePrefix is what every resourceKey of resource starts with.
func resourcePrefix(resource string) []byte {
	k := resourceKey(resource, 0)
	return k[:len(k)-8]
}

// lastResourceKey positions c on the last key of prefix's resource and
// returns it, or nil if the resource has none.
func lastResourceKey(c *bbolt.Cursor, prefix []byte) ([]byte, []byte) {
	// One copy of prefix (never appended to in place: it may share its
	// array with a key handed to bbolt) serves the seek and the compare.
	end := make([]byte, len(prefix)+8)
	binary.BigEndian.PutUint64(end[copy(end, prefix):], ^uint64(0))
	k, v := c.Seek(end)
	switch {
	case k == nil:
		k, v = c.Last()
	case bytes.Equal(k, end):
	default:
		k, v = c.Prev()
	}
	if _, ok := resourceKeyN(prefix, k); !ok {
		return nil, nil
	}
	return k, v
}

// addEvent appends to the resource's history and drops the oldest events
// beyond the cap.
func (s *Store) addEvent(tx *bbolt.Tx, ev tokens.Event) error {
	b := tx.Bucket(bucketEvents)
	prefix := resourcePrefix(ev.Resource)
	c := b.Cursor()
	seq := uint64(1)
	if k, _ := lastResourceKey(c, prefix); k != nil {
		last, _ := resourceKeyN(prefix, k)
		seq = last + 1
	}
	key := resourceKey(ev.Resource, seq)
	// New: seq is past the resource's last event.
	s.fills.noteNewKey(b, &s.fills.events, key, fillAppendedEvents)
	if err := b.Put(key, encodeEvent(&ev)); err != nil {
		return err
	}
	limit := uint64(s.opts.MaxHistoryPerResource)
	if seq <= limit {
		return nil
	}
	// Sequences have no gaps except at the front, so everything at or
	// below seq-limit is beyond the cap; usually that is one event.
	c = b.Cursor()
	for k, _ := c.Seek(prefix); ; k, _ = c.Seek(prefix) {
		n, ok := resourceKeyN(prefix, k)
		if !ok || n > seq-limit {
			return nil
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
}

// History implements tokens.Store: newest first, limit defaulting to 100
// and capped at 1000. A resource without history has an empty one.
func (s *Store) History(ctx context.Context, resource string, limit int) ([]tokens.Event, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	limit = clampLimit(limit)
	var out []tokens.Event
	err := s.db.View(func(tx *bbolt.Tx) error {
		prefix := resourcePrefix(resource)
		c := tx.Bucket(bucketEvents).Cursor()
		for k, v := lastResourceKey(c, prefix); k != nil && len(out) < limit; k, v = c.Prev() {
			if _, ok := resourceKeyN(prefix, k); !ok {
				break
			}
			ev, err := decodeEvent(resource, v)
			if err != nil {
				return fmt.Errorf("history of %q: %w", resource, err)
			}
			out = append(out, ev)
		}
		return nil
	})
	if err != nil {
		return nil, tokens.Unavailable("history", err)
	}
	return out, nil
}
