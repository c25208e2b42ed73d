package tokens

import (
	"encoding/json"
	"time"
)

// The live feed carries rejections between replicas (PostgreSQL NOTIFY,
// Redis pub/sub). Both backends use this one compact encoding, so a
// replica's feed reads the same whichever transport brought it.

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
	LeaseEndedAt time.Time `json:"le,omitzero"`
}

// maxFeedPath cuts long paths so a payload stays small.
const maxFeedPath = 2048

// EncodeRejection is the live feed's payload for r.
func EncodeRejection(r Rejection) ([]byte, error) {
	if len(r.Path) > maxFeedPath {
		r.Path = r.Path[:maxFeedPath] + "…"
	}
	return json.Marshal(wireRejection(r))
}

// DecodeRejection parses an EncodeRejection payload.
func DecodeRejection(b []byte) (Rejection, error) {
	var w wireRejection
	err := json.Unmarshal(b, &w)
	return Rejection(w), err
}
