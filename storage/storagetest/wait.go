package storagetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// waitUntil polls cond until it holds, failing the test if it has not
// within the deadline. The suites wait on the event they expect this way
// instead of sleeping for as long as it usually takes; the deadline only
// bounds a hang, far beyond what a loaded machine needs.
func waitUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitPast waits until the store's clock (Resource.Now of resource, or this
// process's clock for a store that reports none) is past at: a lease that
// ends at at has then expired for the store that judges it, whatever the
// test's own clock says.
func WaitPast(t testing.TB, s tokens.Store, resource string, at time.Time) {
	t.Helper()
	if d := time.Until(at); d > 0 {
		time.Sleep(d) // no earlier than the store could agree: then ask it
	}
	waitUntil(t, waitLimit, "the store's clock past "+at.Format(time.RFC3339Nano), func() bool {
		r, err := s.Resource(context.Background(), resource)
		if err != nil && !errors.Is(err, tokens.ErrNotFound) {
			t.Fatalf("read %s: %v", resource, err)
		}
		return storeNow(r).After(at)
	})
}
