package storagetest

import (
	"context"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// The lease history events of retries (tokens/idempotency.go, rule 8): a
// retry replayed from its record, or refused because the first attempt's
// outcome is unknown or it was another request, is in the resource's
// history with the time of the first attempt, before BeginKey returns and
// across restarts. A first attempt, and a retry told to come back while
// the first is in flight, add nothing.

// Historian reads a resource's lease history (tokens.Store.History).
type Historian interface {
	History(ctx context.Context, resource string, limit int) ([]tokens.Event, error)
}

func keyHistory(t *testing.T, h KeyHarness, s tokens.IdempotencyStore, resource string) []tokens.Event {
	t.Helper()
	var hist Historian
	if h.History != nil {
		hist = h.History(s)
	} else if hs, ok := s.(Historian); ok {
		hist = hs
	} else {
		t.Fatalf("storagetest: %T has no History method; set KeyHarness.History", s)
	}
	evs, err := hist.History(t.Context(), resource, 100)
	if err != nil {
		t.Fatalf("History(%s): %v", resource, err)
	}
	return evs
}

// retry is BeginKey of a second attempt under lease token 9 of "worker-2".
func retry(t *testing.T, s tokens.IdempotencyStore, scope tokens.KeyScope, attempt, fp string) tokens.KeyRecord {
	t.Helper()
	rec, fresh, err := s.BeginKey(t.Context(), tokens.KeyBegin{Scope: scope, Attempt: attempt, Fingerprint: fp, Token: 9,
		Holder: "worker-2", InFlight: time.Minute, Window: longTTL})
	if err != nil {
		t.Fatalf("BeginKey(%s) again: %v", scope.Key, err)
	}
	if fresh {
		t.Fatalf("BeginKey(%s) again was fresh", scope.Key)
	}
	return rec
}

// wantKeyEvent checks ev against the retry that made it and the record it
// found.
func wantKeyEvent(t *testing.T, ev tokens.Event, kind tokens.EventKind, scope tokens.KeyScope, rec tokens.KeyRecord, status int, code string) {
	t.Helper()
	if ev.Kind != kind || ev.Resource != scope.Resource || ev.Token != 9 || ev.Holder != "worker-2" || ev.Key == nil {
		t.Fatalf("history event = %+v (key %+v); want %s of token 9 by worker-2 on %s, with the key's facts", ev, ev.Key, kind, scope.Resource)
	}
	k := ev.Key
	if k.Upstream != scope.Upstream || k.Key != scope.Key || k.Principal != scope.Principal || k.WriteToken != 7 ||
		k.Status != status || k.Code != code {
		t.Fatalf("history event's key facts = %+v; want upstream %q, key %q, principal %q, write token 7, status %d, code %q",
			k, scope.Upstream, scope.Key, scope.Principal, status, code)
	}
	if d := k.WriteAt.Sub(rec.StartedAt); d < -timeSlack || d > timeSlack {
		t.Fatalf("history event's WriteAt = %v, want the first attempt's start %v", k.WriteAt, rec.StartedAt)
	}
	if ev.At.Before(k.WriteAt.Add(-timeSlack)) {
		t.Fatalf("history event at %v, before the write it replays (%v)", ev.At, k.WriteAt)
	}
}

func testKeyHistoryReplay(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	scope := keyScope(t, "a")
	scope.Principal = "billing"
	beginKey(t, s, scope, "att1", fp1, time.Minute, longTTL)
	if evs := keyHistory(t, h, s, scope.Resource); len(evs) != 0 {
		t.Fatalf("a first attempt added %d history events (%+v), want none", len(evs), evs)
	}
	finishKey(t, s, scope, "att1", completed(`{"id":1}`))
	rec := retry(t, s, scope, "att2", fp1)
	if rec.State != tokens.KeyCompleted {
		t.Fatalf("retry found %+v, want the completed record", rec)
	}
	evs := keyHistory(t, h, s, scope.Resource)
	if len(evs) != 1 {
		t.Fatalf("history after one replay has %d events (%+v), want 1", len(evs), evs)
	}
	wantKeyEvent(t, evs[0], tokens.EventReplayed, scope, rec, 201, "")
	retry(t, s, scope, "att3", fp1)
	if evs := keyHistory(t, h, s, scope.Resource); len(evs) != 2 || evs[0].Kind != tokens.EventReplayed {
		t.Fatalf("history after two replays = %+v, want two replayed events", evs)
	}
	// The history is the resource's: another resource's stays empty.
	if evs := keyHistory(t, h, s, scope.Resource+"x"); len(evs) != 0 {
		t.Fatalf("another resource's history has %+v", evs)
	}
}

func testKeyHistoryRefusals(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	open, unknown, done := keyScope(t, "open"), keyScope(t, "unknown"), keyScope(t, "done")
	beginKey(t, s, open, "att1", fp1, time.Hour, longTTL)
	beginKey(t, s, unknown, "att1", fp1, time.Minute, longTTL)
	finishKey(t, s, unknown, "att1", tokens.KeyOutcome{State: tokens.KeyUnknown})
	beginKey(t, s, done, "att1", fp1, time.Minute, longTTL)
	finishKey(t, s, done, "att1", completed("{}"))

	// Still in flight: come back later, nothing recorded.
	retry(t, s, open, "att2", fp1)
	if evs := keyHistory(t, h, s, open.Resource); len(evs) != 0 {
		t.Fatalf("a retry while the first attempt is in flight added %+v, want nothing", evs)
	}
	rec := retry(t, s, unknown, "att2", fp1)
	evs := keyHistory(t, h, s, unknown.Resource)
	if len(evs) != 1 {
		t.Fatalf("history after a retry of an unknown outcome = %+v, want one event", evs)
	}
	wantKeyEvent(t, evs[0], tokens.EventRetryRefused, unknown, rec, 0, tokens.CodeOutcomeUnknown)
	rec = retry(t, s, done, "att2", fp2)
	evs = keyHistory(t, h, s, done.Resource)
	if len(evs) != 1 {
		t.Fatalf("history after a mismatched retry = %+v, want one event", evs)
	}
	wantKeyEvent(t, evs[0], tokens.EventRetryRefused, done, rec, 0, tokens.CodeKeyMismatch)
}

// testKeyHistoryRestart: the events survive a restart, and a key that was
// in flight when the gateway stopped is refused as an unknown outcome
// after it, in the history with the time of the write before the restart.
func testKeyHistoryRestart(t *testing.T, h KeyHarness) {
	s := h.Open(t)
	done, open := keyScope(t, "done"), keyScope(t, "open")
	first := beginKey2(t, s, done)
	finishKey(t, s, done, "att1", completed(`{"id":1}`))
	retry(t, s, done, "att2", fp1)
	started := beginKey2(t, s, open)

	s = h.Reopen(t, s)
	evs := keyHistory(t, h, s, done.Resource)
	if len(evs) != 1 {
		t.Fatalf("history after restart = %+v, want the replay", evs)
	}
	wantKeyEvent(t, evs[0], tokens.EventReplayed, done, first, 201, "")
	rec := retry(t, s, open, "att2", fp1)
	if d := rec.StartedAt.Sub(started.StartedAt); d < -timeSlack || d > timeSlack {
		t.Fatalf("record after restart started at %v, want %v", rec.StartedAt, started.StartedAt)
	}
	evs = keyHistory(t, h, s, open.Resource)
	if len(evs) != 1 {
		t.Fatalf("history after a retry of a key in flight at restart = %+v, want one event", evs)
	}
	wantKeyEvent(t, evs[0], tokens.EventRetryRefused, open, started, 0, tokens.CodeOutcomeUnknown)
}

// beginKey2 is a first attempt att1 with fp1 and a long in-flight bound.
func beginKey2(t *testing.T, s tokens.IdempotencyStore, scope tokens.KeyScope) tokens.KeyRecord {
	t.Helper()
	rec, fresh := beginKey(t, s, scope, "att1", fp1, time.Hour, longTTL)
	if !fresh {
		t.Fatalf("BeginKey(%s) not fresh", scope.Key)
	}
	return rec
}
