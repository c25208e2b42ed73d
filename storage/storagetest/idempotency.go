package storagetest

// The idempotency record suite (RunKeys): begin, finish, drop, expiry and
// deadlines of Idempotency-Key records, concurrent begins, and a restart.

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// KeyHarness tells RunKeys how to get idempotency stores of the backend
// under test.
type KeyHarness struct {
	// Open returns a new, empty, isolated store (cleaned up by the test).
	Open func(t *testing.T) tokens.IdempotencyStore
	// Reopen closes s and opens the same data again, as a restart of the
	// gateway would. Required: the restart rules are the point.
	Reopen func(t *testing.T, s tokens.IdempotencyStore) tokens.IdempotencyStore
	// History reads the lease history in which s records its events, as
	// the gateway's store in that mode does (nil: s's own History method).
	History func(s tokens.IdempotencyStore) Historian
}

// RunKeys runs the idempotency record suite: begin, finish, drop, expiry,
// deadlines, scopes, concurrency, restarts, and the lease history events of
// retries (keyhistory.go).
func RunKeys(t *testing.T, h KeyHarness) {
	if h.Open == nil || h.Reopen == nil {
		t.Fatal("storagetest: KeyHarness.Open and Reopen are required")
	}
	tests := []struct {
		name string
		fn   func(*testing.T, KeyHarness)
	}{
		{"BeginRecordsInProgress", testKeyBegin},
		{"BeginAgainReturnsFirst", testKeyBeginAgain},
		{"ScopesAreSeparate", testKeyScopes},
		{"FinishCompleted", testKeyFinish},
		{"FinishOmittedBody", testKeyFinishOmitted},
		{"FinishUnknown", testKeyFinishUnknown},
		{"FinishOnlyByItsAttempt", testKeyFinishOtherAttempt},
		{"Drop", testKeyDrop},
		{"Expiry", testKeyExpiry},
		{"DeadlineIsUnknown", testKeyDeadline},
		{"ConcurrentBegin", testKeyConcurrentBegin},
		{"Restart", testKeyRestart},
		{"HistoryReplay", testKeyHistoryReplay},
		{"HistoryRefusals", testKeyHistoryRefusals},
		{"HistoryRestart", testKeyHistoryRestart},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
}

func keyScope(t *testing.T, suffix string) tokens.KeyScope {
	return tokens.KeyScope{Resource: resourceName(t, "r"), Upstream: "up", Principal: "", Key: "key-" + suffix}
}

var fp1, fp2 = tokens.Fingerprint("POST", "/a", "", [32]byte{1}), tokens.Fingerprint("POST", "/a", "", [32]byte{2})

func beginKey(t *testing.T, s tokens.IdempotencyStore, scope tokens.KeyScope, attempt, fp string, inFlight, window time.Duration) (tokens.KeyRecord, bool) {
	t.Helper()
	rec, fresh, err := s.BeginKey(t.Context(), tokens.KeyBegin{Scope: scope, Attempt: attempt, Fingerprint: fp, Token: 7,
		InFlight: inFlight, Window: window})
	if err != nil {
		t.Fatalf("BeginKey(%s): %v", scope.Key, err)
	}
	if rec.Scope != scope {
		t.Fatalf("BeginKey(%+v) returned the record of %+v", scope, rec.Scope)
	}
	return rec, fresh
}

func lookupKey(t *testing.T, s tokens.IdempotencyStore, scope tokens.KeyScope) tokens.KeyRecord {
	t.Helper()
	rec, err := s.LookupKey(t.Context(), scope)
	if err != nil {
		t.Fatalf("LookupKey(%s): %v", scope.Key, err)
	}
	return rec
}

func keyNow(r tokens.KeyRecord) time.Time {
	if !r.Now.IsZero() {
		return r.Now
	}
	return time.Now()
}

func finishKey(t *testing.T, s tokens.IdempotencyStore, scope tokens.KeyScope, attempt string, o tokens.KeyOutcome) {
	t.Helper()
	if o.Window == 0 {
		o.Window = longTTL
	}
	if err := s.FinishKey(t.Context(), scope, attempt, o); err != nil {
		t.Fatalf("FinishKey(%s): %v", scope.Key, err)
	}
}

func completed(body string) tokens.KeyOutcome {
	return tokens.KeyOutcome{State: tokens.KeyCompleted, Status: 201,
		Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}, Body: []byte(body)}
}

func testKeyBegin(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	scope := keyScope(t, "a")
	if _, err := s.LookupKey(t.Context(), scope); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("LookupKey of an unused key: %v, want ErrNotFound", err)
	}
	rec, fresh := beginKey(t, s, scope, "att1", fp1, time.Minute, longTTL)
	if !fresh || rec.State != tokens.KeyInProgress || rec.Attempt != "att1" || rec.Fingerprint != fp1 || rec.Token != 7 {
		t.Fatalf("first BeginKey = %+v fresh %v; want a fresh in-progress record of att1, token 7", rec, fresh)
	}
	got := lookupKey(t, s, scope)
	if got.State != tokens.KeyInProgress || got.Attempt != "att1" || got.Fingerprint != fp1 || got.Token != 7 {
		t.Fatalf("LookupKey after begin = %+v", got)
	}
	if d := got.Deadline.Sub(got.StartedAt); d < time.Minute-timeSlack || d > time.Minute+timeSlack {
		t.Fatalf("Deadline-StartedAt = %v, want the in-flight bound 1m", d)
	}
	if d := got.ExpiresAt.Sub(got.StartedAt); d < longTTL-timeSlack || d > longTTL+timeSlack {
		t.Fatalf("ExpiresAt-StartedAt = %v, want the window %v", d, longTTL)
	}
	if err := tokens.JudgeKey(got, fp1, keyNow(got)); !errors.Is(err, tokens.ErrKeyInProgress) {
		t.Fatalf("JudgeKey of an in-flight record: %v, want ErrKeyInProgress", err)
	}
}

func testKeyBeginAgain(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	scope := keyScope(t, "a")
	beginKey(t, s, scope, "att1", fp1, time.Minute, longTTL)
	rec, fresh := beginKey(t, s, scope, "att2", fp2, time.Minute, longTTL)
	if fresh || rec.Attempt != "att1" || rec.Fingerprint != fp1 {
		t.Fatalf("second BeginKey = %+v fresh %v; want the first attempt's record, not fresh", rec, fresh)
	}
	if err := tokens.JudgeKey(rec, fp2, keyNow(rec)); !errors.Is(err, tokens.ErrKeyMismatch) {
		t.Fatalf("JudgeKey with another fingerprint: %v, want ErrKeyMismatch", err)
	}
}

func testKeyScopes(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	base := keyScope(t, "a")
	beginKey(t, s, base, "att0", fp1, time.Minute, longTTL)
	others := []tokens.KeyScope{base, base, base, base}
	others[0].Resource += "x"
	others[1].Upstream = "other"
	others[2].Principal = "alice"
	others[3].Key = "key-b"
	for i, sc := range others {
		if _, fresh := beginKey(t, s, sc, fmt.Sprint("att", i+1), fp1, time.Minute, longTTL); !fresh {
			t.Fatalf("BeginKey(%+v) not fresh: scopes that differ in one part must not share a record", sc)
		}
	}
}

func testKeyFinish(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	scope := keyScope(t, "a")
	beginKey(t, s, scope, "att1", fp1, time.Minute, longTTL)
	body := strings.Repeat("x", 3000) + `{"ok":true}`
	finishKey(t, s, scope, "att1", completed(body))
	got := lookupKey(t, s, scope)
	if got.State != tokens.KeyCompleted || got.Status != 201 || string(got.Body) != body || got.BodyOmitted ||
		fmt.Sprint(got.Header["X-Multi"]) != "[a b]" || fmt.Sprint(got.Header["Content-Type"]) != "[application/json]" {
		t.Fatalf("LookupKey after finish = %+v", got)
	}
	if got.CompletedAt.Before(got.StartedAt) || got.Fingerprint != fp1 || got.Token != 7 {
		t.Fatalf("completed record %+v: want CompletedAt >= StartedAt, fingerprint and token kept", got)
	}
	rec, fresh := beginKey(t, s, scope, "att2", fp1, time.Minute, longTTL)
	if fresh || rec.State != tokens.KeyCompleted || string(rec.Body) != body {
		t.Fatalf("BeginKey after finish = %+v fresh %v; want the completed record", rec, fresh)
	}
	if err := tokens.JudgeKey(rec, fp1, keyNow(rec)); err != nil {
		t.Fatalf("JudgeKey of a completed record: %v, want nil (replay)", err)
	}
	// A second finish changes nothing.
	finishKey(t, s, scope, "att1", tokens.KeyOutcome{State: tokens.KeyUnknown})
	if got := lookupKey(t, s, scope); got.State != tokens.KeyCompleted || got.Status != 201 {
		t.Fatalf("a second FinishKey changed the record: %+v", got)
	}
}

func testKeyFinishOmitted(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	scope := keyScope(t, "a")
	beginKey(t, s, scope, "att1", fp1, time.Minute, longTTL)
	finishKey(t, s, scope, "att1", tokens.KeyOutcome{State: tokens.KeyCompleted, Status: 200, BodyOmitted: true})
	got := lookupKey(t, s, scope)
	if got.State != tokens.KeyCompleted || got.Status != 200 || !got.BodyOmitted || len(got.Body) != 0 {
		t.Fatalf("record with an omitted body = %+v", got)
	}
}

func testKeyFinishUnknown(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	scope := keyScope(t, "a")
	beginKey(t, s, scope, "att1", fp1, time.Minute, longTTL)
	finishKey(t, s, scope, "att1", tokens.KeyOutcome{State: tokens.KeyUnknown})
	rec, fresh := beginKey(t, s, scope, "att2", fp1, time.Minute, longTTL)
	if fresh || rec.State != tokens.KeyUnknown {
		t.Fatalf("BeginKey after an unknown outcome = %+v fresh %v; want the unknown record", rec, fresh)
	}
	if err := tokens.JudgeKey(rec, fp1, keyNow(rec)); !errors.Is(err, tokens.ErrOutcomeUnknown) {
		t.Fatalf("JudgeKey of an unknown outcome: %v, want ErrOutcomeUnknown", err)
	}
	// An unknown outcome is kept for the window from when it was recorded.
	if d := rec.ExpiresAt.Sub(rec.CompletedAt); d < longTTL-timeSlack || d > longTTL+timeSlack {
		t.Fatalf("unknown record kept for %v after it was recorded, want %v", d, longTTL)
	}
}

func testKeyFinishOtherAttempt(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	scope := keyScope(t, "a")
	beginKey(t, s, scope, "att1", fp1, time.Minute, longTTL)
	finishKey(t, s, scope, "att2", completed("wrong"))
	if err := s.DropKey(t.Context(), scope, "att2"); err != nil {
		t.Fatalf("DropKey(other attempt): %v", err)
	}
	if got := lookupKey(t, s, scope); got.State != tokens.KeyInProgress || got.Attempt != "att1" {
		t.Fatalf("another attempt's FinishKey/DropKey changed the record: %+v", got)
	}
}

func testKeyDrop(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	scope := keyScope(t, "a")
	beginKey(t, s, scope, "att1", fp1, time.Minute, longTTL)
	if err := s.DropKey(t.Context(), scope, "att1"); err != nil {
		t.Fatalf("DropKey: %v", err)
	}
	if _, err := s.LookupKey(t.Context(), scope); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("LookupKey after DropKey: %v, want ErrNotFound", err)
	}
	if _, fresh := beginKey(t, s, scope, "att2", fp2, time.Minute, longTTL); !fresh {
		t.Fatal("BeginKey after DropKey is not fresh")
	}
	// A completed record cannot be dropped.
	finishKey(t, s, scope, "att2", completed("done"))
	if err := s.DropKey(t.Context(), scope, "att2"); err != nil {
		t.Fatalf("DropKey(completed): %v", err)
	}
	if got := lookupKey(t, s, scope); got.State != tokens.KeyCompleted {
		t.Fatalf("DropKey removed a completed record: %+v", got)
	}
}

func testKeyExpiry(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	done, open := keyScope(t, "done"), keyScope(t, "open")
	beginKey(t, s, done, "att1", fp1, time.Minute, longTTL)
	// Each record's window starts no earlier than the call that set it
	// began: a record found gone sooner than its window after that moment
	// vanished early, whatever the store's clock says.
	doneFrom := time.Now()
	finishKey(t, s, done, "att1", tokens.KeyOutcome{State: tokens.KeyCompleted, Status: 200, Window: shortTTL})
	openFrom := time.Now()
	beginKey(t, s, open, "att1", fp1, time.Minute, shortTTL)
	gone := func(what string, from time.Time, err error) bool {
		t.Helper()
		if err != nil && !errors.Is(err, tokens.ErrNotFound) {
			t.Fatalf("LookupKey %s: %v", what, err)
		}
		if err == nil {
			return false
		}
		if lived := time.Since(from); lived < shortTTL-timeSlack {
			t.Fatalf("the %s record was gone %v after it was set, before its %v window ended", what, lived, shortTTL)
		}
		return true
	}
	deadline := time.Now().Add(waitLimit)
	for doneGone, openGone := false, false; !doneGone || !openGone; {
		if !doneGone {
			_, err := s.LookupKey(t.Context(), done)
			doneGone = gone("completed", doneFrom, err)
		}
		if !openGone {
			_, err := s.LookupKey(t.Context(), open)
			openGone = gone("in-progress", openFrom, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("records with a %v window still there after %v", shortTTL, waitLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// An expired record is replaced by the next attempt, fingerprint and all.
	got, fresh := beginKey(t, s, done, "att2", fp2, time.Minute, longTTL)
	if !fresh || got.Attempt != "att2" || got.State != tokens.KeyInProgress || got.Fingerprint != fp2 {
		t.Fatalf("BeginKey after expiry = %+v fresh %v; want a fresh record", got, fresh)
	}
}

func testKeyDeadline(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	scope := keyScope(t, "a")
	beginKey(t, s, scope, "att1", fp1, shortTTL, longTTL)
	deadline := time.Now().Add(waitLimit)
	for {
		rec := lookupKey(t, s, scope)
		err := tokens.JudgeKey(rec, fp1, keyNow(rec))
		if errors.Is(err, tokens.ErrOutcomeUnknown) {
			break
		}
		if !errors.Is(err, tokens.ErrKeyInProgress) {
			t.Fatalf("JudgeKey: %v, want in progress, then outcome unknown", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("in-progress record past its %v deadline not unknown after %v", shortTTL, waitLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Past its deadline a record is still the key's: never a second forward.
	if _, fresh := beginKey(t, s, scope, "att2", fp1, time.Minute, longTTL); fresh {
		t.Fatal("BeginKey past the first attempt's deadline was fresh: the key would be forwarded twice")
	}
}

func testKeyConcurrentBegin(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	scope := keyScope(t, "a")
	const n = 16
	var wg sync.WaitGroup
	var mu sync.Mutex
	var fresh []string
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			att := fmt.Sprint("att", i)
			rec, ok, err := s.BeginKey(t.Context(), tokens.KeyBegin{Scope: scope, Attempt: att, Fingerprint: fp1, Token: 7,
				InFlight: time.Minute, Window: longTTL})
			if err != nil {
				errs <- err
				return
			}
			if ok {
				mu.Lock()
				fresh = append(fresh, att)
				mu.Unlock()
			} else if rec.State != tokens.KeyInProgress {
				errs <- fmt.Errorf("not fresh, but state %s", rec.State)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(fresh) != 1 {
		t.Fatalf("%d concurrent BeginKey calls were fresh (%v), want exactly 1", len(fresh), fresh)
	}
	if got := lookupKey(t, s, scope); got.Attempt != fresh[0] {
		t.Fatalf("record belongs to %s, but %s was told it was first", got.Attempt, fresh[0])
	}
}

// testKeyRestart: records survive a restart; one that was in progress when
// the gateway stopped answers "outcome unknown" after it, at once (not only
// when its deadline passes), and is never fresh again within its window.
func testKeyRestart(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	done, open, unknown := keyScope(t, "done"), keyScope(t, "open"), keyScope(t, "unknown")
	beginKey(t, s, done, "att1", fp1, time.Minute, longTTL)
	finishKey(t, s, done, "att1", completed(`{"id":1}`))
	beginKey(t, s, open, "att1", fp1, time.Hour, longTTL)
	beginKey(t, s, unknown, "att1", fp1, time.Minute, longTTL)
	finishKey(t, s, unknown, "att1", tokens.KeyOutcome{State: tokens.KeyUnknown})

	s = h.Reopen(t, s)
	if got := lookupKey(t, s, done); got.State != tokens.KeyCompleted || got.Status != 201 || string(got.Body) != `{"id":1}` ||
		fmt.Sprint(got.Header["X-Multi"]) != "[a b]" {
		t.Fatalf("completed record after restart = %+v", got)
	}
	rec, fresh := beginKey(t, s, open, "att2", fp1, time.Minute, longTTL)
	if fresh {
		t.Fatal("a key in progress before the restart was fresh after it: it would be forwarded twice")
	}
	if err := tokens.JudgeKey(rec, fp1, keyNow(rec)); !errors.Is(err, tokens.ErrOutcomeUnknown) {
		t.Fatalf("after restart, a key that was in flight: %v (%+v), want ErrOutcomeUnknown", err, rec)
	}
	if rec := lookupKey(t, s, unknown); rec.State != tokens.KeyUnknown {
		t.Fatalf("unknown record after restart = %+v", rec)
	}
}
