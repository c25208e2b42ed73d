package bolt

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// stallCommits holds the store's committer in a transaction until the
// returned function is called, as a disk whose fsync hangs does.
func stallCommits(t *testing.T, s *Store) (resume func()) {
	t.Helper()
	started, unblock := make(chan struct{}), make(chan struct{})
	c := &call{fn: func(*bbolt.Tx) error {
		select {
		case <-started:
		default:
			close(started)
		}
		<-unblock
		return nil
	}}
	s.group.submit(c)
	<-started
	done := false
	resume = func() {
		if !done {
			done = true
			close(unblock)
		}
	}
	t.Cleanup(resume)
	return resume
}

// expired is a context whose deadline passes while the caller waits for a
// stalled commit (the store must not wait past it).
func expired(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

func wantGaveUp(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, tokens.ErrStoreUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s during a stalled commit: %v; want ErrStoreUnavailable wrapping DeadlineExceeded", what, err)
	}
	if ra := tokens.ErrorOf(err).RetryAfter; ra <= 0 {
		t.Fatalf("%s: no RetryAfter in %v", what, err)
	}
}

func grant(t *testing.T, s *Store, ctx context.Context, resource string) (tokens.Lease, error) {
	t.Helper()
	return s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: "h", TTL: time.Minute})
}

// A grant whose caller's deadline passes while the disk stalls answers
// store_unavailable at the deadline, not when the commit ends; it is not
// made afterwards (nobody would know its lease), and the next grant of
// the resource gets the next token.
func TestStalledCommitGrantGivesUpAndIsNotMade(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{})
	resume := stallCommits(t, s)
	_, err := grant(t, s, expired(t), "r")
	wantGaveUp(t, "grant", err)
	resume()
	l, err := grant(t, s, t.Context(), "r")
	if err != nil || l.Token != 1 {
		t.Fatalf("grant after the stall: token %d, %v; want token 1 (the abandoned grant was not made)", l.Token, err)
	}
}

// A release or a drain whose caller gave up is reported as failed; it is
// still committed, before any later change of its resource (the resource's
// lock is held until its commit ends): a drain that gave up still keeps
// grants out.
func TestStalledCommitReleaseAndDrainGiveUpButHoldTheirResource(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{})
	l, err := grant(t, s, t.Context(), "rel")
	if err != nil {
		t.Fatal(err)
	}
	resume := stallCommits(t, s)
	_, err = s.Release(expired(t), l.ID)
	wantGaveUp(t, "release", err)
	wantGaveUp(t, "drain", s.Drain(expired(t), "drained", time.Hour))

	// While the stall lasts, the next change of either resource waits for
	// the lock the abandoned commits hold, and gives up in turn.
	_, err = grant(t, s, expired(t), "drained")
	wantGaveUp(t, "grant behind an abandoned drain", err)

	resume()
	if _, err := s.Renew(t.Context(), l.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("renew after an abandoned release: %v; want ErrLeaseLost (the release was committed)", err)
	}
	if _, err := grant(t, s, t.Context(), "drained"); !errors.Is(err, tokens.ErrFenceBusy) {
		t.Fatalf("grant after an abandoned drain: %v; want ErrFenceBusy (the drain was committed)", err)
	}
	r, err := s.Resource(t.Context(), "rel")
	if err != nil || r.Lease == nil || !r.Lease.Released() {
		t.Fatalf("cache after an abandoned release: %+v, %v; want the released lease", r, err)
	}
}

// Rejections and idempotency changes whose callers gave up are still
// committed (a refusal is always recorded); Close waits for them.
func TestStalledCommitRecordsGiveUpButLand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegw.db")
	s := openAt(t, path, Options{})
	resume := stallCommits(t, s)
	_, err := s.RecordRejection(expired(t), tokens.Rejection{Resource: "r", Code: tokens.CodeStaleToken, Token: 1, Holder: "h"})
	wantGaveUp(t, "record rejection", err)
	scope := tokens.KeyScope{Resource: "r", Upstream: "u", Key: "k"}
	wantGaveUp(t, "finish key", s.FinishKey(expired(t), scope, "a", tokens.KeyOutcome{State: tokens.KeyCompleted, Window: time.Hour}))
	resume()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openAt(t, path, Options{})
	rs, err := s.Rejections(t.Context(), tokens.RejectionQuery{Resource: "r"})
	if err != nil || len(rs) != 1 {
		t.Fatalf("rejections after an abandoned record: %d, %v; want 1", len(rs), err)
	}
}
