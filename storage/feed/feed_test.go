package feed_test

import (
	"testing"

	"github.com/fencegw/fencegw/storage/storagetest"
)

// The embedded mode's feed (one process) passes the feed suite; the
// replicated feed runs it in storage/postgres and storage/redis, over
// their transports.
func TestLocalConformance(t *testing.T) {
	storagetest.RunFeed(t, storagetest.FeedHarness{})
}
