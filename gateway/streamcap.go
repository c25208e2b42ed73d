package gateway

import (
	"strconv"
	"sync"
	"time"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// Live streams hold a goroutine, a 1024-event buffer and a connection
// each, for as long as the client keeps them open: they are capped, in
// all (Config.MaxStreams) and per API key (Config.MaxStreamsPerKey), so
// that one key, or anyone without authentication, cannot open them until
// the gateway runs out of memory or file descriptors. Past a cap a stream
// is refused with 429 rate_limited and Retry-After.

// Defaults of the stream caps.
const (
	DefaultMaxStreams       = 256
	DefaultMaxStreamsPerKey = 16
	streamRetry             = 5 * time.Second
)

type streamSlots struct {
	mu     sync.Mutex
	max    int
	perKey int
	total  int
	byKey  map[string]int
}

func newStreamSlots(max, perKey int) *streamSlots {
	if max <= 0 {
		max = DefaultMaxStreams
	}
	if perKey <= 0 {
		perKey = DefaultMaxStreamsPerKey
	}
	return &streamSlots{max: max, perKey: perKey, byKey: map[string]int{}}
}

// take reserves a slot for key ("" without authentication: only the total
// cap applies) and returns the func that frees it, or the refusal.
func (s *streamSlots) take(key string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.total >= s.max:
		return nil, &tokens.Error{Kind: problems.ErrRateLimited, RetryAfter: streamRetry,
			Detail: "the gateway serves at most " + strconv.Itoa(s.max) + " live streams at once"}
	case key != "" && s.byKey[key] >= s.perKey:
		return nil, &tokens.Error{Kind: problems.ErrRateLimited, RetryAfter: streamRetry,
			Detail: "key " + strconv.Quote(key) + " has " + strconv.Itoa(s.perKey) + " live streams open, its cap"}
	}
	s.total++
	if key != "" {
		s.byKey[key]++
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.total--
		if key != "" {
			if s.byKey[key]--; s.byKey[key] == 0 {
				delete(s.byKey, key)
			}
		}
	}, nil
}
