package feed

import (
	"bytes"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/fencegw/fencegw/tokens"
)

// The feed's wire format. Both transports (PostgreSQL NOTIFY, Redis pub/sub)
// use this one compact encoding, so a replica's feed reads the same
// whichever transport brought it.

// wireRejection is the feed's payload: short keys, because NOTIFY payloads
// must stay under 8000 bytes.
type wireRejection struct {
	ID           int64     `json:"id"`
	At           time.Time `json:"at"`
	Resource     string    `json:"r"`
	Code         string    `json:"c"`
	Token        int64     `json:"t"`
	CurrentToken int64     `json:"ct"`
	Holder       string    `json:"h,omitempty"`
	LeaseHint    string    `json:"lh,omitempty"`
	Method       string    `json:"m,omitempty"`
	Upstream     string    `json:"u,omitempty"`
	Path         string    `json:"p,omitempty"`
	Principal    string    `json:"pr,omitempty"`
	LeaseEndedAt time.Time `json:"le,omitzero"`
	WouldRefuse  bool      `json:"wr,omitempty"`
	TraceID      string    `json:"tr,omitempty"`
	Repeats      int64     `json:"rp,omitempty"`
	FirstAt      time.Time `json:"fa,omitzero"`
}

// maxFeedPath cuts long paths so a payload stays small.
const maxFeedPath = 2048

// EncodeRejection is the live feed's payload for r.
func EncodeRejection(r tokens.Rejection) ([]byte, error) {
	if len(r.Path) > maxFeedPath {
		n := maxFeedPath
		for n > 0 && !utf8.RuneStart(r.Path[n]) {
			n-- // never cut a character in two
		}
		r.Path = r.Path[:n] + "…"
	}
	return json.Marshal(wireRejection(r))
}

// DecodeRejection parses an EncodeRejection payload.
func DecodeRejection(b []byte) (tokens.Rejection, error) {
	var w wireRejection
	err := json.Unmarshal(b, &w)
	r := tokens.Rejection(w)
	if r.Repeats <= 0 { // from a replica that does not count repeats
		r.Repeats, r.FirstAt = 1, r.At
	}
	return r, err
}

// EncodeRejections packs rs into as few payloads as fit in max bytes each:
// one EncodeRejection per line. A storm of refusals then costs the feed one
// message per payload, not one per refusal. A rejection too large for max
// on its own gets a payload of its own.
func EncodeRejections(rs []tokens.Rejection, max int) ([][]byte, error) {
	var out [][]byte
	var cur []byte
	for _, r := range rs {
		b, err := EncodeRejection(r)
		if err != nil {
			return nil, err
		}
		if len(cur) > 0 && len(cur)+1+len(b) > max {
			out = append(out, cur)
			cur = nil
		}
		if len(cur) > 0 {
			cur = append(cur, '\n')
		}
		cur = append(cur, b...)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out, nil
}

// DecodeRejections parses an EncodeRejections payload (or a single
// EncodeRejection one). JSON escapes newlines inside strings, so a line is
// a rejection.
func DecodeRejections(payload []byte) ([]tokens.Rejection, error) {
	var out []tokens.Rejection
	for line := range bytes.SplitSeq(payload, []byte{'\n'}) {
		if len(line) == 0 {
			continue
		}
		r, err := DecodeRejection(line)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}
