package storagetest

// How the suites wait: polling for the event they expect, and for the
// store's clock past a time, with deadlines that only bound a hang.

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

// waitSucceeds calls try until it succeeds, failing the test with try's last
// error if it has not within the deadline: waitUntil for an event that
// only an attempt shows (a write that goes through again, a message that
// arrives once a listener is back). period spaces the attempts that each
// cost a round trip; 0 for an attempt that waits by itself.
func waitSucceeds(t testing.TB, within, period time.Duration, what string, try func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := try()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(period)
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
