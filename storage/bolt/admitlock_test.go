package bolt

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// The embedded mode's admission with the LocalLocker itself (which Admit
// keeps in the Permit, not behind Locker.Shared): an admitted write holds
// its resource's shared lock until Done, and a refused one holds nothing,
// whether the Permit is Admit's or in the caller's storage (AdmitInto).
// An exclusive lock asked for with a context that has already ended is
// taken only if nothing holds the resource, so each step is decided
// without waiting.
func TestEmbeddedAdmissionLocksUntilDone(t *testing.T) {
	t.Parallel()
	st := openAt(t, filepath.Join(t.TempDir(), "f.db"), Options{})
	locker := tokens.NewLocalLocker()
	svc := tokens.New(tokens.Config{Store: st, Locker: locker, Logger: quiet})
	ctx := t.Context()
	ended, cancel := context.WithCancel(ctx)
	cancel()
	free := func() bool {
		t.Helper()
		unlock, err := locker.Exclusive(ended, "a")
		if err != nil {
			return false
		}
		unlock()
		return true
	}
	lease, err := svc.Acquire(ctx, tokens.AcquireRequest{Resource: "a", Holder: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	write := tokens.Write{Method: "POST", Upstream: "up", Path: "/x"}

	var storage tokens.Permit
	for _, into := range []*tokens.Permit{nil, &storage} {
		p, err := svc.AdmitInto(ctx, lease.ID, write, into)
		if err != nil {
			t.Fatal(err)
		}
		if into != nil && p != into {
			t.Fatal("AdmitInto's Permit is not in the storage it was given")
		}
		if free() {
			t.Fatal("the resource's exclusive lock was taken while an admitted write held its shared lock")
		}
		p.Done(tokens.OutcomeKnown)
		if !free() {
			t.Fatal("the resource's exclusive lock could not be taken after the write's Done")
		}
	}

	if _, err := svc.Release(ctx, lease.ID, ""); err != nil {
		t.Fatal(err)
	}
	for _, into := range []*tokens.Permit{nil, new(tokens.Permit)} {
		if p, err := svc.AdmitInto(ctx, lease.ID, write, into); err == nil || p != nil {
			t.Fatalf("a write under a released lease was admitted (%v, %v)", p, err)
		}
		if !free() {
			t.Fatal("the resource's exclusive lock could not be taken after a refused write")
		}
	}
}
