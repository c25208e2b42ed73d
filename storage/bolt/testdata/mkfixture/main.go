// Command mkfixture writes a store file with the store of the tree it is
// run in, and what that store answers about it (JSON), for storage/bolt's
// TestFileOfMainOpens: a file written by an older version must open and
// read the same. main-3786b66.* were made from a checkout of 3786b66
// (before the compact layout) with this file copied to cmd/mkfixture:
//
//	go run ./cmd/mkfixture DIR && gzip -9 DIR/fencegw.db DIR/expected.json
package main

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

func oldLeaseID() string {
	var b [20]byte
	_, _ = rand.Read(b[:])
	return tokens.LeaseIDPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

func main() {
	dir := os.Args[1]
	var now atomic.Int64
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now.Store(start.UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	step := func(d time.Duration) { now.Add(int64(d)) }
	path := filepath.Join(dir, "fencegw.db")
	s, err := bolt.Open(path, bolt.Options{Now: clock})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	var ids []string
	grant := func(res, id string, ttl time.Duration) tokens.Lease {
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: id, Resource: res, Holder: "h-" + res, Owner: "o", TTL: ttl})
		if err != nil {
			log.Fatal(err)
		}
		ids = append(ids, l.ID)
		step(time.Millisecond)
		return l
	}
	must := func(_ tokens.Lease, err error) {
		if err != nil {
			log.Fatal(err)
		}
		step(time.Millisecond)
	}
	for i := 1; i <= 100; i++ { // a few pages of each bucket
		grant(fmt.Sprintf("a/%d", i), tokens.NewLeaseID(), time.Hour)
	}
	old := grant("old", oldLeaseID(), time.Hour)
	step(time.Second)
	must(s.Renew(ctx, old.ID, 2*time.Hour))
	r10 := grant("r", tokens.NewLeaseID(), time.Hour)
	must(s.Release(ctx, r10.ID))
	grant("r", oldLeaseID(), time.Hour)
	if err := s.Drain(ctx, "drained", 10*time.Minute); err != nil {
		log.Fatal(err)
	}
	c := grant("revoked", tokens.NewLeaseID(), time.Hour)
	must(s.Revoke(ctx, c.ID, "admin"))
	grant("expired", tokens.NewLeaseID(), time.Second)
	step(2 * time.Second)
	if _, err := s.RecordRejection(ctx, tokens.Rejection{At: clock(), Resource: "r", Code: "stale_token", Token: 1, CurrentToken: 2,
		Holder: "h-r", LeaseHint: tokens.LeaseHint(r10.ID), Method: "PUT", Upstream: "u", Path: "/p", LeaseEndedAt: clock()}); err != nil {
		log.Fatal(err)
	}
	if err := s.AddWrites(ctx, []tokens.TokenWrites{{Resource: "a/1", Token: 1, N: 3}, {Resource: "r", Token: 2, N: 1}}); err != nil {
		log.Fatal(err)
	}
	names := []string{"old", "r", "drained", "revoked", "expired", "never"}
	for i := 1; i <= 100; i++ {
		names = append(names, fmt.Sprintf("a/%d", i))
	}
	d, err := dumpStore(ctx, s, names, ids)
	if err != nil {
		log.Fatal(err)
	}
	if err := s.Close(); err != nil {
		log.Fatal(err)
	}
	out, err := json.Marshal(struct {
		Now   time.Time
		Names []string
		IDs   []string
		Dump  *fixtureDump
	}{clock().UTC(), names, ids, d})
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "expected.json"), out, 0o644); err != nil {
		log.Fatal(err)
	}
}

// fixtureDump is what a store answers about the fixture's resources and
// leases, its times in UTC, so that two stores' answers compare as JSON.
type fixtureDump struct {
	Resources  map[string]*tokens.Resource
	Missing    []string // names Resource did not find
	Leases     map[string]tokens.Lease
	History    map[string][]tokens.Event
	Current    []tokens.Lease
	Writes     map[string]map[int64]uint64
	Rejections []tokens.Rejection
}

func dumpStore(ctx context.Context, s *bolt.Store, names, ids []string) (*fixtureDump, error) {
	d := &fixtureDump{Resources: map[string]*tokens.Resource{}, Leases: map[string]tokens.Lease{},
		History: map[string][]tokens.Event{}, Writes: map[string]map[int64]uint64{}}
	utc := func(t *time.Time) {
		if !t.IsZero() {
			*t = t.UTC()
		}
	}
	lease := func(l *tokens.Lease) { utc(&l.GrantedAt); utc(&l.ExpiresAt); utc(&l.ReleasedAt) }
	for _, n := range names {
		r, err := s.Resource(ctx, n)
		if err != nil {
			d.Missing = append(d.Missing, n)
		} else {
			utc(&r.DrainUntil)
			utc(&r.Now)
			if r.Lease != nil {
				lease(r.Lease)
			}
			d.Resources[n] = &r
		}
		h, err := s.History(ctx, n, 0)
		if err != nil {
			return nil, err
		}
		for i := range h {
			utc(&h[i].At)
			utc(&h[i].ExpiresAt)
			if h[i].Key != nil {
				utc(&h[i].Key.WriteAt)
			}
		}
		d.History[n] = h
		w, err := s.Writes(ctx, n, []int64{1, 2, 3})
		if err != nil {
			return nil, err
		}
		d.Writes[n] = w
	}
	for _, id := range ids {
		l, err := s.Lease(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("lease %s: %w", id, err)
		}
		lease(&l)
		d.Leases[id] = l
	}
	cur, err := s.CurrentLeases(ctx, 1000)
	if err != nil {
		return nil, err
	}
	for i := range cur {
		lease(&cur[i])
	}
	d.Current = cur
	rej, err := s.Rejections(ctx, tokens.RejectionQuery{})
	if err != nil {
		return nil, err
	}
	for i := range rej {
		utc(&rej[i].At)
		utc(&rej[i].LeaseEndedAt)
	}
	d.Rejections = rej
	return d, nil
}
