package tokens

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The id's byte order must be the order of the times the ids were made, at
// every digit boundary of the time part (31 -> 32 ms carries into the next
// character), so that the bolt store's B-tree appends them.
func TestLeaseIDTimeOrdered(t *testing.T) {
	base := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var times []time.Time
	for _, d := range []time.Duration{0, time.Millisecond, 31 * time.Millisecond, 32 * time.Millisecond, 1023 * time.Millisecond, 1024 * time.Millisecond, time.Hour, 1000 * 24 * time.Hour} {
		times = append(times, base.Add(d))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		times = append(times, base.Add(time.Duration(rng.Int64N(int64(100*365*24*time.Hour)))).Truncate(time.Millisecond))
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(times); i++ {
		a, b := newLeaseID(times[i-1]), newLeaseID(times[i])
		if times[i-1].Equal(times[i]) {
			continue
		}
		if a >= b {
			t.Fatalf("id of %v (%s) does not sort before the id of %v (%s)", times[i-1], a, times[i], b)
		}
	}
}

func TestLeaseIDFormat(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 123e6, time.UTC)
	id := newLeaseID(at)
	if len(id) != leaseIDLen || !strings.HasPrefix(id, LeaseIDPrefix) {
		t.Fatalf("id %q: want %d bytes starting with %q", id, leaseIDLen, LeaseIDPrefix)
	}
	var ms int64
	for _, c := range id[len(LeaseIDPrefix) : len(LeaseIDPrefix)+leaseTimeChars] {
		ms = ms<<5 | int64(strings.IndexRune(base32hex, c))
	}
	if ms != at.UnixMilli() {
		t.Fatalf("time part of %s is %d ms, want %d", id, ms, at.UnixMilli())
	}
	random, err := leaseIDEncoding.DecodeString(id[len(LeaseIDPrefix)+leaseTimeChars:])
	if err != nil || len(random) != 20 {
		t.Fatalf("random part of %s: %d bytes, %v; want 20", id, len(random), err)
	}
	if strings.Trim(id[len(LeaseIDPrefix):], base32hex) != "" {
		t.Fatalf("id %s has characters outside lowercase base32hex", id)
	}
	// A clock before 1970 still makes a well-formed id.
	if early := newLeaseID(time.Unix(-5, 0)); len(early) != leaseIDLen || early[:13] != LeaseIDPrefix+"0000000000" {
		t.Fatalf("id before 1970: %s", early)
	}
}

// Ids made in the same millisecond differ in their 160 random bits.
func TestLeaseIDRandomPart(t *testing.T) {
	at := time.Now()
	seen := map[string]bool{}
	for range 10_000 {
		id := newLeaseID(at)
		r := id[len(LeaseIDPrefix)+leaseTimeChars:]
		if seen[r] {
			t.Fatalf("random part %s repeated", r)
		}
		seen[r] = true
	}
}

func TestLeaseHint(t *testing.T) {
	at := time.Now()
	a, b := newLeaseID(at), newLeaseID(at)
	ha, hb := LeaseHint(a), LeaseHint(b)
	random := len(LeaseIDPrefix) + leaseTimeChars
	if ha != LeaseIDPrefix+a[random:random+leaseHintChars]+"…" {
		t.Fatalf("hint of %s is %q, want the start of its random part", a, ha)
	}
	// Two leases of the same millisecond share the time part: the hint must
	// still tell them apart (a 2^-30 chance that it does not).
	if ha == hb {
		t.Fatalf("ids %s and %s made in the same millisecond have the same hint %q", a, b, ha)
	}
	for id, want := range map[string]string{
		"fl_4w5sz2l6kq3d7yq2ywj6n2k4xq7r3m2a": "fl_4w5sz2…", // an id from before the time-ordered format
		"fl_madeupid":                         "fl_madeup…", // anything a client sends
		"fl_abc":                              "…",
		"":                                    "…",
	} {
		if got := LeaseHint(id); got != want {
			t.Errorf("LeaseHint(%q) = %q, want %q", id, got, want)
		}
	}
}
