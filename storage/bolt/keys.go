package bolt

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// Idempotency records (tokens.IdempotencyStore).
//
// Records are keyed by their scope in bucketKeys; bucketKeyOrder maps an
// insertion sequence to the scope, so that the oldest records (the first to
// expire, and the first to go when the store holds MaxIdempotencyRecords)
// are found by a cursor at the front. Every change runs through the
// store's group commit, like the leases and the rejection log: a keyed
// write costs two durable changes (begin, finish), and under load many
// writes share each commit and its fsync. A lone change after a quiet
// spell is committed at once.
//
// Only one process opens the file, so at Open no write can be in flight:
// every record still in progress is turned into an unknown outcome then.

// DefaultMaxIdempotencyRecords bounds the idempotency records kept.
const DefaultMaxIdempotencyRecords = 100_000

// keyPrunePerCommit bounds the expired or surplus records one change
// deletes.
const keyPrunePerCommit = 256

var (
	bucketKeys     = []byte("idempotency")       // scope -> record
	bucketKeyOrder = []byte("idempotency_order") // seq -> scope
)

type keyOpKind int

const (
	keyBegin keyOpKind = iota
	keyFinish
	keyDrop
)

type keyOp struct {
	kind    keyOpKind
	begin   tokens.KeyBegin
	scope   tokens.KeyScope
	attempt string
	outcome tokens.KeyOutcome
}

type keyResult struct {
	rec   tokens.KeyRecord
	fresh bool
	err   error
}

// keyLog is the store's count of idempotency records, kept by the group
// commit's transactions (only one runs at a time).
type keyLog struct {
	count   int       // records in the file as last committed
	tx      *bbolt.Tx // the transaction txCount counts for
	txCount int       // records as tx sees them
	// prunedIn is the transaction that last looked for expired records.
	prunedIn *bbolt.Tx
	commits  atomic.Int64
}

// inTx is the record count as tx sees it, to be changed with tx's
// changes; it becomes the committed count if tx commits.
func (k *keyLog) inTx(tx *bbolt.Tx) *int {
	if k.tx != tx {
		k.tx, k.txCount = tx, k.count
		tx.OnCommit(func() {
			k.count, k.tx, k.prunedIn = k.txCount, nil, nil
			k.commits.Add(1)
		})
	}
	return &k.txCount
}

// KeyCommits is how many transactions (each one fsync) have committed
// idempotency changes since Open: with group commit, under load, far fewer
// than the changes.
func (s *Store) KeyCommits() int64 { return s.keys.commits.Load() }

var _ tokens.IdempotencyStore = (*Store)(nil)

// openKeys creates the buckets and turns records left in progress into
// unknown outcomes.
func (s *Store) openKeys() error {
	s.keys = &keyLog{}
	turned := 0
	err := s.db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketKeys)
		if err != nil {
			return err
		}
		order, err := tx.CreateBucketIfNotExists(bucketKeyOrder)
		if err != nil {
			return err
		}
		s.keys.count = order.Stats().KeyN
		now := s.now()
		type change struct {
			k []byte
			v []byte
		}
		var changes []change
		err = b.ForEach(func(k, v []byte) error {
			rec, _, err := decodeKeyRecord(k, v)
			if err != nil {
				return nil // unreadable: left for pruning
			}
			if rec.State != tokens.KeyInProgress {
				return nil
			}
			rec.State, rec.CompletedAt = tokens.KeyUnknown, now
			seq, _ := keyRecordSeq(v)
			changes = append(changes, change{append([]byte(nil), k...), encodeKeyRecord(&rec, seq)})
			return nil
		})
		if err != nil {
			return err
		}
		for _, c := range changes {
			if err := b.Put(c.k, c.v); err != nil {
				return err
			}
		}
		turned = len(changes)
		return nil
	})
	if err != nil {
		return tokens.Unavailable("open idempotency records", err)
	}
	if turned > 0 {
		s.log.Warn("idempotency keys that were in flight when the gateway stopped now answer outcome unknown", "keys", turned)
	}
	return nil
}

// BeginKey implements tokens.IdempotencyStore. A retry of a key whose
// first attempt is still in flight changes nothing and records no event,
// so it is answered from a read, without a commit: a client told to come
// back every second (409 idempotency_key_in_progress) costs no fsync.
func (s *Store) BeginKey(ctx context.Context, b tokens.KeyBegin) (tokens.KeyRecord, bool, error) {
	if rec, ok, err := s.peekInFlight(ctx, b); err != nil || ok {
		return rec, false, err
	}
	res := s.keyDo(ctx, keyOp{kind: keyBegin, begin: b, scope: b.Scope})
	return res.rec, res.fresh, res.err
}

// peekInFlight returns b's scope's record if it is unexpired and a retry
// of it gets no history event (its first attempt is in flight): what the
// committer would return without changing anything.
func (s *Store) peekInFlight(ctx context.Context, b tokens.KeyBegin) (tokens.KeyRecord, bool, error) {
	if err := s.enter(ctx); err != nil {
		return tokens.KeyRecord{}, false, err
	}
	defer s.leave()
	var rec tokens.KeyRecord
	ok := false
	err := s.db.View(func(tx *bbolt.Tx) error {
		k := scopeKey(b.Scope)
		v := tx.Bucket(bucketKeys).Get(k)
		if v == nil {
			return nil
		}
		r, _, err := decodeKeyRecord(k, v)
		if err != nil {
			return nil // the committer replaces it
		}
		now := s.now()
		if _, event := tokens.KeyHistoryEvent(r, b, now); !event && r.State == tokens.KeyInProgress && now.Before(r.ExpiresAt) {
			r.Now = now
			rec, ok = r, true
		}
		return nil
	})
	if err != nil {
		return tokens.KeyRecord{}, false, tokens.Unavailable("begin idempotency key", err)
	}
	return rec, ok, nil
}

// FinishKey implements tokens.IdempotencyStore.
func (s *Store) FinishKey(ctx context.Context, scope tokens.KeyScope, attempt string, o tokens.KeyOutcome) error {
	return s.keyDo(ctx, keyOp{kind: keyFinish, scope: scope, attempt: attempt, outcome: o}).err
}

// DropKey implements tokens.IdempotencyStore.
func (s *Store) DropKey(ctx context.Context, scope tokens.KeyScope, attempt string) error {
	return s.keyDo(ctx, keyOp{kind: keyDrop, scope: scope, attempt: attempt}).err
}

// LookupKey implements tokens.IdempotencyStore.
func (s *Store) LookupKey(ctx context.Context, scope tokens.KeyScope) (tokens.KeyRecord, error) {
	if err := s.enter(ctx); err != nil {
		return tokens.KeyRecord{}, err
	}
	defer s.leave()
	var rec tokens.KeyRecord
	found := false
	err := s.db.View(func(tx *bbolt.Tx) error {
		k := scopeKey(scope)
		v := tx.Bucket(bucketKeys).Get(k)
		if v == nil {
			return nil
		}
		r, _, err := decodeKeyRecord(k, v)
		if err != nil {
			return err
		}
		rec, found = r, true
		return nil
	})
	if err != nil {
		return tokens.KeyRecord{}, tokens.Unavailable("lookup idempotency key", err)
	}
	rec.Now = s.now()
	if !found || !rec.Now.Before(rec.ExpiresAt) {
		return tokens.KeyRecord{}, notFound()
	}
	return rec, nil
}

// keyDo commits op (in the group commit) and waits for it until ctx ends.
// A begin whose caller is gone before it runs is dropped: a record in
// progress that no write follows would answer its retries "in progress"
// until its deadline. A finish or drop runs all the same.
func (s *Store) keyDo(ctx context.Context, op keyOp) keyResult {
	if err := s.enter(ctx); err != nil {
		return keyResult{err: err}
	}
	var res keyResult
	c := &call{fn: func(tx *bbolt.Tx) error {
		now := s.now()
		b, order := tx.Bucket(bucketKeys), tx.Bucket(bucketKeyOrder)
		count := s.keys.inTx(tx)
		r, delta, err := s.applyKeyOp(tx, b, order, op, now)
		if err != nil {
			return err
		}
		// Expired records are looked for once a transaction (as many
		// changes share it as share its fsync); surplus ones at every
		// change past the cap, so that the cap holds at every commit.
		n := 0
		if s.keys.prunedIn != tx || *count+delta > s.opts.MaxIdempotencyRecords {
			s.keys.prunedIn = tx
			if n, err = s.pruneKeys(b, order, *count+delta, now); err != nil {
				return err
			}
		}
		*count += delta - n
		res = r
		return nil
	}}
	if op.kind == keyBegin {
		c.gone = ctx
	}
	if err := s.update(ctx, "idempotency key", c, func(error) { s.leave() }); err != nil {
		return keyResult{err: err}
	}
	return res
}

// applyKeyOp applies one change in tx and returns how the record count
// changed. A begin that finds a record adds its history event in the same
// transaction: a replay shares the group commit it already waits for.
func (s *Store) applyKeyOp(tx *bbolt.Tx, b, order *bbolt.Bucket, op keyOp, now time.Time) (keyResult, int, error) {
	k := scopeKey(op.scope)
	v := b.Get(k)
	var cur tokens.KeyRecord
	var seq uint64
	if v != nil {
		var err error
		if cur, seq, err = decodeKeyRecord(k, v); err != nil {
			v = nil // unreadable: replaced below as if expired
		}
	}
	delta := 0
	switch op.kind {
	case keyBegin:
		if v != nil && now.Before(cur.ExpiresAt) {
			cur.Now = now
			if ev, ok := tokens.KeyHistoryEvent(cur, op.begin, now); ok {
				if err := s.addEvent(tx, ev); err != nil {
					return keyResult{}, 0, err
				}
			}
			return keyResult{rec: cur}, 0, nil
		}
		if v != nil { // expired: its order entry goes with it
			if err := order.Delete(seqKey(seq)); err != nil {
				return keyResult{}, 0, err
			}
			delta--
		}
		next, err := order.NextSequence()
		if err != nil {
			return keyResult{}, 0, err
		}
		rec := tokens.KeyRecord{Scope: op.scope, Attempt: op.begin.Attempt, Fingerprint: op.begin.Fingerprint,
			State: tokens.KeyInProgress, Token: op.begin.Token, StartedAt: now,
			Deadline: now.Add(op.begin.InFlight), ExpiresAt: now.Add(op.begin.Window)}
		if err := b.Put(k, encodeKeyRecord(&rec, next)); err != nil {
			return keyResult{}, 0, err
		}
		if err := order.Put(seqKey(next), k); err != nil {
			return keyResult{}, 0, err
		}
		rec.Now = now
		return keyResult{rec: rec, fresh: true}, delta + 1, nil
	case keyFinish:
		if v == nil || cur.Attempt != op.attempt || cur.State != tokens.KeyInProgress {
			return keyResult{}, 0, nil
		}
		cur.State, cur.CompletedAt = op.outcome.State, now
		cur.ExpiresAt = now.Add(op.outcome.Window)
		if op.outcome.State == tokens.KeyCompleted {
			cur.Status, cur.Header, cur.Body, cur.BodyOmitted = op.outcome.Status, op.outcome.Header, op.outcome.Body, op.outcome.BodyOmitted
		}
		return keyResult{}, 0, b.Put(k, encodeKeyRecord(&cur, seq))
	default: // keyDrop
		if v == nil || cur.Attempt != op.attempt || cur.State != tokens.KeyInProgress {
			return keyResult{}, 0, nil
		}
		if err := b.Delete(k); err != nil {
			return keyResult{}, 0, err
		}
		return keyResult{}, -1, order.Delete(seqKey(seq))
	}
}

// pruneKeys deletes, oldest first, expired records and those beyond
// MaxIdempotencyRecords, at most keyPrunePerCommit of them, and returns how
// many order entries it removed. Order is by start and expiry is start plus
// the window (or later, once finished): the first unexpired record may hide
// expired ones behind it, which lookups ignore and later passes delete.
func (s *Store) pruneKeys(b, order *bbolt.Bucket, count int, now time.Time) (int, error) {
	type victim struct{ seq, scope []byte }
	var victims []victim
	c := order.Cursor()
	for k, scope := c.First(); k != nil && len(victims) < keyPrunePerCommit; k, scope = c.Next() {
		surplus := count-len(victims) > s.opts.MaxIdempotencyRecords
		v := b.Get(scope)
		if v == nil {
			victims = append(victims, victim{seq: k}) // stale order entry
			continue
		}
		rec, seq, err := decodeKeyRecord(scope, v)
		switch {
		case err != nil:
			victims = append(victims, victim{k, scope}) // unreadable
		case !bytesEqualSeq(k, seq):
			victims = append(victims, victim{seq: k}) // the scope was begun again
		case surplus || !now.Before(rec.ExpiresAt):
			victims = append(victims, victim{k, scope})
		default:
			k = nil // stop
		}
		if k == nil {
			break
		}
	}
	for _, vc := range victims {
		if err := order.Delete(vc.seq); err != nil {
			return 0, err
		}
		if vc.scope != nil {
			if err := b.Delete(vc.scope); err != nil {
				return 0, err
			}
		}
	}
	return len(victims), nil
}

func bytesEqualSeq(k []byte, seq uint64) bool {
	n, ok := keySeq(k)
	return ok && n == seq
}

// scopeKey encodes a scope as a bucket key (length-prefixed parts).
func scopeKey(sc tokens.KeyScope) []byte {
	e := &encoder{}
	e.str(sc.Resource)
	e.str(sc.Upstream)
	e.str(sc.Principal)
	e.str(sc.Key)
	return e.b
}

func decodeScope(k []byte) (tokens.KeyScope, error) {
	d := &decoder{b: k, version: codecVersion}
	sc := tokens.KeyScope{Resource: d.str(), Upstream: d.str(), Principal: d.str(), Key: d.str()}
	return sc, d.finish("idempotency scope")
}

// encodeKeyRecord: the scope is the key; the order sequence comes first so
// that it can be read without decoding the rest.
func encodeKeyRecord(r *tokens.KeyRecord, seq uint64) []byte {
	e := newEncoder()
	e.uint(seq)
	e.str(r.Attempt)
	e.str(r.Fingerprint)
	e.str(string(r.State))
	e.int(r.Token)
	e.time(r.StartedAt)
	e.time(r.Deadline)
	e.time(r.CompletedAt)
	e.time(r.ExpiresAt)
	e.int(int64(r.Status))
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		names = append(names, k)
	}
	sort.Strings(names)
	e.uint(uint64(len(names)))
	for _, k := range names {
		e.str(k)
		e.uint(uint64(len(r.Header[k])))
		for _, v := range r.Header[k] {
			e.str(v)
		}
	}
	e.uint(uint64(len(r.Body)))
	e.b = append(e.b, r.Body...)
	if r.BodyOmitted {
		e.uint(1)
	} else {
		e.uint(0)
	}
	return e.b
}

func keyRecordSeq(v []byte) (uint64, error) {
	d := newDecoder("idempotency record", v)
	seq := d.uint()
	return seq, d.err
}

var errTooMany = errors.New("too many entries")

func decodeKeyRecord(k, v []byte) (tokens.KeyRecord, uint64, error) {
	sc, err := decodeScope(k)
	if err != nil {
		return tokens.KeyRecord{}, 0, err
	}
	d := newDecoder("idempotency record", v)
	seq := d.uint()
	r := tokens.KeyRecord{Scope: sc}
	r.Attempt = d.str()
	r.Fingerprint = d.str()
	r.State = tokens.KeyState(d.str())
	r.Token = d.int()
	r.StartedAt = d.time()
	r.Deadline = d.time()
	r.CompletedAt = d.time()
	r.ExpiresAt = d.time()
	r.Status = int(d.int())
	n := d.uint()
	if n > uint64(len(d.b)) {
		return r, 0, fmt.Errorf("idempotency record headers: %w: %w", errTooMany, errCorrupt)
	}
	if n > 0 {
		r.Header = make(map[string][]string, n)
	}
	for range n {
		name := d.str()
		m := d.uint()
		if m > uint64(len(d.b)) {
			return r, 0, fmt.Errorf("idempotency record header values: %w: %w", errTooMany, errCorrupt)
		}
		vals := make([]string, 0, m)
		for range m {
			vals = append(vals, d.str())
		}
		r.Header[name] = vals
	}
	if body := d.str(); body != "" {
		r.Body = []byte(body)
	}
	r.BodyOmitted = d.uint() == 1
	return r, seq, d.finish("idempotency record")
}

// encodeKeyEvent appends an event's idempotency facts (codec version 4): a
// presence flag, then the fields.
func encodeKeyEvent(e *encoder, k *tokens.KeyEvent) {
	if k == nil {
		e.uint(0)
		return
	}
	e.uint(1)
	e.str(k.Upstream)
	e.str(k.Key)
	e.str(k.Principal)
	e.time(k.WriteAt)
	e.int(k.WriteToken)
	e.int(int64(k.Status))
	e.str(k.Code)
}

func decodeKeyEvent(d *decoder) *tokens.KeyEvent {
	if d.uint() == 0 {
		return nil
	}
	k := &tokens.KeyEvent{Upstream: d.str(), Key: d.str(), Principal: d.str()}
	k.WriteAt = d.time()
	k.WriteToken = d.int()
	k.Status = int(d.int())
	k.Code = d.str()
	return k
}
