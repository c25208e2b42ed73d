package tokens

// The fence rule of the broken build failpoint.HighestSeen.

import "sync"

// highestSeen is the broken fence rule of failpoint.HighestSeen (see
// Service.judge): per resource, the highest token any write was admitted
// under. Only that build ever writes to it.
var highestSeen struct {
	sync.Mutex
	m map[string]int64
}

// judgeHighestSeen refuses a write only if a higher token has already
// written to its resource: a superseded or expired lease still passes
// until its successor's first write.
func judgeHighestSeen(l Lease) error {
	highestSeen.Lock()
	defer highestSeen.Unlock()
	if highestSeen.m == nil {
		highestSeen.m = map[string]int64{}
	}
	if seen := highestSeen.m[l.Resource]; l.Token < seen {
		return &Error{Kind: ErrStaleToken, Resource: l.Resource, Token: l.Token, CurrentToken: seen, Holder: l.Holder}
	}
	highestSeen.m[l.Resource] = l.Token
	return nil
}
