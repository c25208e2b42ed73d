package feed_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/feed"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// The embedded mode's feed (one process) passes the feed suite; the
// replicated feed runs it in storage/postgres and storage/redis, over
// their transports.
func TestLocalConformance(t *testing.T) {
	storagetest.RunFeed(t, storagetest.FeedHarness{})
}

// hungTransport never delivers: each publish waits for its context to end.
type hungTransport struct {
	sends, live atomic.Int32 // publishes, and those whose context was not done yet
}

func (h *hungTransport) PublishRejections(ctx context.Context, _ []tokens.Rejection) error {
	h.sends.Add(1)
	if ctx.Err() == nil {
		h.live.Add(1)
	}
	<-ctx.Done()
	return ctx.Err()
}

func (h *hungTransport) ListenRejections(ctx context.Context, _ func(tokens.Rejection), _ func()) error {
	<-ctx.Done()
	return ctx.Err()
}

// Closing over a transport that is down waits one SendTimeout for the whole
// queue, not one per batch still queued: a shutdown is not held for
// (queue / batch) × SendTimeout.
func TestCloseOverAHungTransportWaitsOnce(t *testing.T) {
	h := &hungTransport{}
	f := feed.NewReplicated(h, feed.Options{Batch: 1, Queue: 100, SendTimeout: 50 * time.Millisecond})
	for i := range 20 {
		f.Publish(tokens.Rejection{ID: int64(i + 1), Resource: "r"})
	}
	f.Close()
	if live := h.live.Load(); live > 2 {
		// The send in flight when Close began, and the first one under
		// Close's deadline: every later batch finds it ended.
		t.Errorf("%d sends (of %d) waited for the transport after Close began, want at most 2", live, h.sends.Load())
	}
}
