package bolt

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// TestPackLeaseID: a time-ordered id packs into 27 bytes and back, packed
// ids sort as the ids do, and nothing else is taken for one.
func TestPackLeaseID(t *testing.T) {
	var ids []string
	for range 200 {
		ids = append(ids, tokens.NewLeaseID())
	}
	ids = append(ids, "fl_"+"0000000000"+"00000000000000000000000000000000", "fl_"+"vrvvvvvvvv"+"vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv")
	var packed [][]byte
	for _, id := range ids {
		p, ok := packLeaseID(id)
		if !ok {
			t.Fatalf("packLeaseID(%s) refused a time-ordered id", id)
		}
		if got := unpackLeaseID(p[:]); got != id {
			t.Fatalf("unpackLeaseID(packLeaseID(%s)) = %s", id, got)
		}
		packed = append(packed, bytes.Clone(p[:]))
		if got, err := leaseKeyID(leaseKey(id)); err != nil || got != id || !bytes.Equal(leaseKey(id), p[:]) {
			t.Fatalf("leaseKeyID(leaseKey(%s)) = %s, %v; want the id, its key packed", id, got, err)
		}
	}
	slices.Sort(ids)
	slices.SortFunc(packed, bytes.Compare)
	for i, p := range packed {
		if unpackLeaseID(p) != ids[i] {
			t.Fatalf("packed ids sort differently from the ids at %d: %s, %s", i, unpackLeaseID(p), ids[i])
		}
	}
	good := tokens.NewLeaseID()
	for _, id := range []string{"", "fl_x", oldLeaseID(), good[:len(good)-1], good + "0", "FL_" + good[3:],
		good[:20] + "w" + good[21:], good[:20] + "A" + good[21:], good[:20] + "\n" + good[21:],
		"fl_vsvvvvvvvv" + good[13:], // would pack to a first byte of 0xff, the other ids' tag
		string(make([]byte, packedLeaseIDLen))} {
		if _, ok := packLeaseID(id); ok {
			t.Fatalf("packLeaseID(%q) packed an id not in the time-ordered format", id)
		}
		if got, err := leaseKeyID(leaseKey(id)); err != nil || got != id || len(leaseKey(id)) != len(id)+1 {
			t.Fatalf("leaseKeyID(leaseKey(%q)) = %q, %v; want the id, after a tag byte", id, got, err)
		}
	}
	if _, err := leaseKeyID([]byte("fl_x")); err == nil {
		t.Fatal("leaseKeyID took a key leaseKey does not make")
	}
}

// TestCodecV5RoundTrip: the offsets and numbers of version 5 give every
// value back, the zero times and the unusual ones (released before its
// grant, expired before it, far apart) too.
func TestCodecV5RoundTrip(t *testing.T) {
	at := time.Unix(1800000000, 123456789)
	for _, l := range []tokens.Lease{
		{ID: "a", Resource: "r", Holder: "h", Token: 3, TTL: 30 * time.Second, GrantedAt: at, ExpiresAt: at.Add(30 * time.Second)},
		{ID: "a", Resource: "r", Holder: "h", Token: 3, TTL: 30 * time.Second, GrantedAt: at, ExpiresAt: at.Add(time.Hour), ReleasedAt: at},
		{ID: "a", Resource: "r", Holder: "h", Token: 3, TTL: time.Second, GrantedAt: at, ExpiresAt: at.Add(-time.Second), ReleasedAt: at.Add(-1)},
		{ID: "a", Resource: "r", Holder: "h", Token: 3, GrantedAt: at, ExpiresAt: at.Add(1), ReleasedAt: at.Add(1)},
		{ID: "a", Resource: "r", Holder: "h", Token: 3, TTL: time.Minute, GrantedAt: at},
		{ID: "a", Resource: "r", Holder: "h", Token: 3, TTL: time.Minute, ExpiresAt: time.Unix(0, 1), ReleasedAt: time.Unix(-5, 0)},
	} {
		got, err := decodeLease(l.ID, encodeLease(&l))
		if err != nil || !got.GrantedAt.Equal(l.GrantedAt) || !got.ExpiresAt.Equal(l.ExpiresAt) || !got.ReleasedAt.Equal(l.ReleasedAt) ||
			got.ExpiresAt.IsZero() != l.ExpiresAt.IsZero() || got.ReleasedAt.IsZero() != l.ReleasedAt.IsZero() || got.TTL != l.TTL {
			t.Fatalf("lease round trip = %+v, %v; want %+v", got, err, l)
		}
	}
	for _, kind := range append(slices.Clone(eventKinds[1:]), "some_future_kind") {
		for _, exp := range []time.Time{{}, at, at.Add(-time.Hour), at.Add(30 * time.Second)} {
			ev := tokens.Event{At: at, Resource: "r", Kind: kind, Token: 7, Holder: "h", ExpiresAt: exp, Actor: "admin"}
			got, err := decodeEvent("r", encodeEvent(&ev))
			if err != nil || got.Kind != kind || !got.ExpiresAt.Equal(exp) || got.ExpiresAt.IsZero() != exp.IsZero() || !got.At.Equal(at) || got.Actor != "admin" {
				t.Fatalf("event round trip = %+v, %v; want %+v", got, err, ev)
			}
		}
	}
	for _, cur := range []string{"", tokens.NewLeaseID(), oldLeaseID(), "x"} {
		st := resState{token: 9, current: cur, drainUntil: at}
		got, err := decodeResource(encodeResource(&st))
		if err != nil || got.token != 9 || got.current != cur || !got.drainUntil.Equal(at) {
			t.Fatalf("resource round trip = %+v, %v; want %+v", got, err, st)
		}
	}
	// A time-ordered id is packed: the record is 18 bytes shorter.
	id := tokens.NewLeaseID()
	if n := len(encodeResource(&resState{token: 1, current: id})); n != 1+1+1+packedLeaseIDLen+1 {
		t.Fatalf("a resource record with a time-ordered lease id is %d bytes, want %d", n, 1+1+1+packedLeaseIDLen+1)
	}
	if _, err := decodeEvent("r", []byte{codecVersion, 2, byte(len(eventKinds)), 0}); err == nil {
		t.Fatal("an event of an unknown kind number decoded")
	}
}

// packLeaseIDByChar is packLeaseID as it was, a character at a time: the
// reference the grouped version must agree with, byte for byte.
func packLeaseIDByChar(id string) (p [packedLeaseIDLen]byte, ok bool) {
	if len(id) != len(leaseIDPrefix)+leaseIDChars || id[:len(leaseIDPrefix)] != leaseIDPrefix {
		return p, false
	}
	var acc uint32
	bits, j := 0, 0
	for i := len(leaseIDPrefix); i < len(id); i++ {
		c := id[i]
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'v':
			v = c - 'a' + 10
		default:
			return p, false
		}
		acc = acc<<5 | uint32(v)
		if bits += 5; bits >= 8 {
			bits -= 8
			p[j] = byte(acc >> bits)
			j++
		}
	}
	p[j] = byte(acc << (8 - bits))
	return p, p[0] != otherLeaseKey
}

// TestPackLeaseIDAgreesByChar: fresh ids, ids with each character
// replaced by every byte value (base32hex digits or not), the highest
// digits and ids starting at 0xff's digits, packed both ways.
func TestPackLeaseIDAgreesByChar(t *testing.T) {
	check := func(id string) {
		t.Helper()
		got, gotOK := packLeaseID(id)
		want, wantOK := packLeaseIDByChar(id)
		if gotOK != wantOK || (wantOK && got != want) {
			t.Fatalf("packLeaseID(%q) = %x, %v; character by character %x, %v", id, got, gotOK, want, wantOK)
		}
	}
	base := tokens.NewLeaseID()
	check(base)
	check(leaseIDPrefix + strings.Repeat("v", leaseIDChars))
	check(leaseIDPrefix + strings.Repeat("0", leaseIDChars))
	check(leaseIDPrefix + "vs" + strings.Repeat("0", leaseIDChars-2)) // packs to a first byte of 0xff
	check(leaseIDPrefix + "vr" + strings.Repeat("v", leaseIDChars-2))
	for i := len(leaseIDPrefix); i < len(base); i++ {
		for c := range 256 {
			check(base[:i] + string([]byte{byte(c)}) + base[i+1:])
		}
	}
	for range 1000 {
		check(tokens.NewLeaseID())
	}
}
