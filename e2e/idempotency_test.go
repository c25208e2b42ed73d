package e2e

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/replica"
	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/tokens"
)

// keyed counts the arrivals that carried an Idempotency-Key.
func keyed(u *upstream, key string) int {
	n := 0
	for _, a := range u.seen() {
		if a.Header.Get(gateway.HeaderIdempotencyKey) == `"`+key+`"` {
			n++
		}
	}
	return n
}

// The seed story with a key: a charge times out at the gateway (504) and
// lands at the upstream anyway; the worker, not knowing, retries it with
// its key on another replica, and the charge lands once. A retry that was
// answered is replayed on any replica, also under a newer lease.
func TestIdempotentRetryLandsOnce(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		up := newUpstream(t)
		gws := m.start(t, map[string]string{"payments": up.URL}, options{forwardTimeout: 300 * time.Millisecond, drainPeriod: 300 * time.Millisecond})
		res := "acct:88213:" + m.name
		lease := acquire(t, pick(gws, 0), res, "worker-A", 10*time.Second)
		charge := func(replica int, l leaseJSON, key, body string) answer {
			return do(t, "POST", pick(gws, replica)+"/v1/proxy/payments/charges", body,
				gateway.HeaderLease, l.LeaseID, gateway.HeaderIdempotencyKey, `"`+key+`"`)
		}

		var landed sync.WaitGroup
		landed.Add(1)
		up.setHold(func(a arrival) {
			if a.Header.Get(gateway.HeaderIdempotencyKey) == `"charge-1"` {
				time.Sleep(600 * time.Millisecond) // the upstream is slow; the charge lands after the 504
				landed.Done()
			}
		})
		wantProblem(t, charge(0, lease, "charge-1", `{"amount":500}`), http.StatusGatewayTimeout, "upstream_timeout")
		landed.Wait()
		for i := 1; i <= 2; i++ {
			wantProblem(t, charge(i, lease, "charge-1", `{"amount":500}`), http.StatusConflict, "idempotency_outcome_unknown")
		}
		if n := keyed(up, "charge-1"); n != 1 {
			t.Fatalf("charge-1 reached the upstream %d times, want 1", n)
		}

		// An answered write is replayed on every replica, without the upstream.
		first := charge(1, lease, "charge-2", `{"amount":700}`)
		if first.Status != http.StatusOK || first.Header.Get(gateway.HeaderReplayed) != "" {
			t.Fatalf("charge-2: %d %s", first.Status, first.Body)
		}
		for i := range len(gws) + 1 {
			again := charge(i, lease, "charge-2", `{"amount":700}`)
			if again.Status != http.StatusOK || string(again.Body) != string(first.Body) || again.Header.Get(gateway.HeaderReplayed) != "true" {
				t.Fatalf("retry %d of charge-2: %d %q replayed=%q; want %q replayed", i, again.Status, again.Body, again.Header.Get(gateway.HeaderReplayed), first.Body)
			}
		}
		wantProblem(t, charge(0, lease, "charge-2", `{"amount":701}`), http.StatusUnprocessableEntity, "idempotency_key_mismatch")

		// Under the next holder's lease the key still applies once; the
		// superseded lease is refused whatever its key.
		if a := do(t, "DELETE", pick(gws, 2)+"/v1/leases/"+lease.LeaseID, nil); a.Status != http.StatusNoContent {
			t.Fatalf("release: %d %s", a.Status, a.Body)
		}
		var next leaseJSON
		deadline := time.Now().Add(5 * time.Second)
		for { // the resource drains after charge-1's unknown outcome
			a := do(t, "POST", pick(gws, 0)+"/v1/leases", map[string]any{"resource": res, "holder": "worker-B", "ttl_ms": 10000, "wait_ms": 2000})
			if a.Status == http.StatusCreated {
				next = acquireDecode(t, a)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("acquire after release: %d %s", a.Status, a.Body)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if a := charge(1, next, "charge-2", `{"amount":700}`); a.Status != http.StatusOK || a.Header.Get(gateway.HeaderReplayed) != "true" {
			t.Fatalf("charge-2 under the next lease: %d %s replayed=%q", a.Status, a.Body, a.Header.Get(gateway.HeaderReplayed))
		}
		wantProblem(t, charge(2, lease, "charge-2", `{"amount":700}`), http.StatusConflict, "stale_token")
		if n := keyed(up, "charge-2"); n != 1 {
			t.Fatalf("charge-2 reached the upstream %d times, want 1", n)
		}

		// The lease history tells it, on every replica, with the time of
		// each key's first write (the stale retry is a rejection, not here).
		for i, g := range gws {
			evs, err := g.store.History(t.Context(), res, 100)
			if err != nil {
				t.Fatalf("replica %d history: %v", i, err)
			}
			var got []string
			writeAt := map[string]time.Time{}
			for _, ev := range slices.Backward(evs) {
				if ev.Key == nil {
					continue
				}
				got = append(got, fmt.Sprintf("%s %s %s token %d of %s, write token %d", ev.Kind, ev.Key.Key, ev.Key.Code, ev.Token, ev.Holder, ev.Key.WriteToken))
				if at, ok := writeAt[ev.Key.Key]; ok && !at.Equal(ev.Key.WriteAt) || ev.Key.WriteAt.IsZero() || ev.At.Before(ev.Key.WriteAt) {
					t.Fatalf("replica %d: event %+v names the write of %v (earlier %v)", i, ev, ev.Key.WriteAt, at)
				}
				writeAt[ev.Key.Key] = ev.Key.WriteAt
			}
			tok := fmt.Sprint(lease.Token)
			want := []string{
				"retry_refused charge-1 idempotency_outcome_unknown token " + tok + " of worker-A, write token " + tok,
				"retry_refused charge-1 idempotency_outcome_unknown token " + tok + " of worker-A, write token " + tok,
			}
			for range len(gws) + 1 {
				want = append(want, "replayed charge-2  token "+tok+" of worker-A, write token "+tok)
			}
			want = append(want, "retry_refused charge-2 idempotency_key_mismatch token "+tok+" of worker-A, write token "+tok,
				fmt.Sprintf("replayed charge-2  token %d of worker-B, write token %s", next.Token, tok))
			if !slices.Equal(got, want) {
				t.Fatalf("replica %d's history of the keys:\n%s\nwant:\n%s", i, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if !writeAt["charge-1"].Before(writeAt["charge-2"]) {
				t.Fatalf("charge-1's write at %v is not before charge-2's at %v", writeAt["charge-1"], writeAt["charge-2"])
			}
		}
	})
}

func acquireDecode(t *testing.T, a answer) leaseJSON {
	t.Helper()
	var l leaseJSON
	if err := json.Unmarshal(a.Body, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// The dashboard's timeline shows a replay with the time of the write it
// replays, and a refused retry, in real Chromium.
func TestBrowserTimelineShowsReplays(t *testing.T) {
	ctx, dialogs := browser(t)
	up := newUpstream(t)
	g := startReplica(t, replica.Config{
		Mode:   storagemode.Config{Data: t.TempDir()},
		Live:   gateway.Live{Upstreams: upstreamURLs(t, map[string]string{"payments": up.URL})},
		Logger: slog.New(slog.DiscardHandler),
	})
	store := g.r.Mode().Keys
	const res = "acct:88213"
	lease := acquire(t, g.URL, res, "worker-A", time.Hour)
	charge := func(key, body string) answer {
		return do(t, "POST", g.URL+"/v1/proxy/payments/charges", body, gateway.HeaderLease, lease.LeaseID, gateway.HeaderIdempotencyKey, `"`+key+`"`)
	}
	if a := charge("charge-7", `{"amount":500}`); a.Status != http.StatusOK {
		t.Fatalf("first charge: %d %s", a.Status, a.Body)
	}
	rec, err := store.LookupKey(t.Context(), tokens.KeyScope{Resource: res, Upstream: "payments", Key: "charge-7"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the replay's own time differs from the write's
	if a := charge("charge-7", `{"amount":500}`); a.Header.Get(gateway.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %s, not replayed", a.Status, a.Body)
	}
	wantProblem(t, charge("charge-7", `{"amount":501}`), http.StatusUnprocessableEntity, "idempotency_key_mismatch")

	within(t, ctx, 15*time.Second, "open resource", chromedp.Navigate(g.URL+"/ui/resources/"+url.PathEscape(res)))
	steps := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('#timeline li')).map(li => li.className + ': ' + li.textContent.replace(/\s+/g, ' ').trim())`)
	writeAt := rec.StartedAt.UTC().Format("15:04:05.000")
	want := []string{
		"step retry_refused: ", "worker-A retried charge-7 on payments with token 1: refused idempotency_key_mismatch, the key's write of " + writeAt + " was another request",
		"step replayed: ", "worker-A retried charge-7 on payments with token 1: replayed 200 from the write of " + writeAt + "; nothing reached the upstream",
		"step granted: ", "worker-A acquired token 1",
	}
	if len(steps) != 3 {
		t.Fatalf("timeline has %d rows, want 3:\n%s", len(steps), strings.Join(steps, "\n"))
	}
	for i := range steps {
		if !strings.HasPrefix(steps[i], want[2*i]) || !strings.Contains(steps[i], want[2*i+1]) {
			t.Fatalf("timeline row %d = %q, want %q … %q", i, steps[i], want[2*i], want[2*i+1])
		}
	}
	// The write's time is machine-readable too, for whoever reads the page.
	if got := eval[string](t, ctx, `document.querySelector('#timeline li.replayed time.write').getAttribute('datetime')`); got != rec.StartedAt.UTC().Format(time.RFC3339Nano) {
		t.Errorf("replayed row's write time = %q, want %q", got, rec.StartedAt.UTC().Format(time.RFC3339Nano))
	}
	screenshot(t, ctx, "timeline-replays", "")
	dialogs.none(t, ctx)
}
