package storagetest

import (
	"testing"
	"time"
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
