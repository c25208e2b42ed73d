//go:build fencegw_break_highest_seen

package tokens

import "sync"

// Deliberately broken: writes are fenced on the highest token seen in a
// write instead of the granted one, and expiry is ignored, so a superseded
// holder still gets through until its successor's first write.
const breakHighestSeen = true

var highestSeen = struct {
	sync.Mutex
	m map[string]int64
}{m: map[string]int64{}}

func judgeHighestSeen(l Lease) error {
	highestSeen.Lock()
	defer highestSeen.Unlock()
	if seen := highestSeen.m[l.Resource]; l.Token < seen {
		return &Error{Kind: ErrStaleToken, Resource: l.Resource, Token: l.Token, CurrentToken: seen, Holder: l.Holder}
	}
	highestSeen.m[l.Resource] = l.Token
	return nil
}
