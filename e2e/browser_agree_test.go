package e2e

// The overview agrees with itself, live: after a refusal the cards, the
// chart, the leases table and the feed all show it, with no reload and no
// nudge (no visibilitychange, which would force a fetch), and with the
// page's periodic refresh switched off (withoutPolling), so that only the
// live feed can have brought it. How soon is logged, not asserted.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// withoutPolling keeps the pages the browser loads from now on from
// starting timers of a second or more (the overview's periodic refresh);
// shorter ones (the countdowns' tick, the feed's 100 ms coalescing) still
// run.
func withoutPolling(t *testing.T, ctx context.Context) {
	t.Helper()
	_, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: `(() => {
  const every = window.setInterval;
  window.setInterval = (f, ms, ...args) => ms >= 1000 ? 0 : every(f, ms, ...args);
})()`})
	if err != nil {
		t.Fatalf("switch the page's polling off: %v", err)
	}
}

// agreeWithin bounds a hang of waitAgree, not the dashboard's speed.
const agreeWithin = 15 * time.Second

// pageState reads what the overview shows, in one line: the range card,
// the feed's rows (each with its repeats), the chart's bars summed, the leases card and the leases
// table (holder/token of each row).
const pageState = `(() => {
  const text = s => { const e = document.querySelector(s); return e ? e.textContent.trim() : 'none'; };
  const bars = Array.from(document.querySelectorAll('#chart rect.bar title'))
    .reduce((a, t) => a + parseInt(t.textContent.split(': ')[1], 10), 0);
  const leases = Array.from(document.querySelectorAll('#leases tbody tr'))
    .filter(tr => tr.querySelector('[data-expires]'))
    .map(tr => tr.cells[1].textContent.trim() + '/' + tr.cells[2].textContent.trim());
  // A row counts its repeats (one lease's refusals with one code are one entry).
  const feed = Array.from(document.querySelectorAll('#feed tbody tr[data-id]'))
    .reduce((a, tr) => a + parseInt(tr.getAttribute('data-repeats') || (tr.cells[0] && tr.cells[0].getAttribute('data-repeats')) || '1', 10), 0);
  return 'cards=' + text('#total-range') + ' chart=' + bars + ' chart-data=' + (document.getElementById('chart') || {dataset: {}}).dataset.total +
    ' feed=' + feed + ' leases-card=' + text('#leases-held') + ' leases=' + leases.join(',');
})()`

// agreement is the line pageState returns when the page shows rejections
// refusals and exactly the leases given as holder/token.
func agreement(rejections int, leases ...string) string {
	list := ""
	for i, l := range leases {
		if i > 0 {
			list += ","
		}
		list += l
	}
	return fmt.Sprintf("cards=%d chart=%d chart-data=%d feed=%d leases-card=%d leases=%s", rejections, rejections, rejections, rejections, len(leases), list)
}

// waitAgree waits until the page shows want and returns how long after
// since that was; it fails the test if that took more than within (a hang
// bound: agreeWithin).
func waitAgree(t *testing.T, ctx context.Context, since time.Time, within time.Duration, want string) time.Duration {
	t.Helper()
	var got string
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		v, err := chromedp.Run(c, chromedp.Evaluate[string](pageState))
		cancel()
		if err != nil {
			t.Fatalf("read the overview: %v", err)
		}
		got = v
		if got == want {
			return time.Since(since)
		}
		if time.Since(since) > within {
			t.Fatalf("%v after the refusal the overview shows\n  %s\nwant\n  %s", time.Since(since).Round(time.Millisecond), got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBrowserOverviewAgreesAfterRefusal(t *testing.T) {
	ctx, dialogs := browser(t)
	up := newUpstream(t)
	d := startDashboard(t, map[string]string{"statements": up.URL})
	const res = "stmt:acct:70011"

	a := acquire(t, d.URL, res, "worker-A", 1500*time.Millisecond)
	if ans := write(t, d.URL, "statements", "/lines", a, `{"line":1}`); ans.Status != 200 {
		t.Fatalf("worker-A write: %d %s", ans.Status, ans.Body)
	}
	withoutPolling(t, ctx)
	within(t, ctx, 15*time.Second, "open overview", chromedp.Navigate(d.URL+"/ui/?range=15m"))
	waitLive(t, ctx)
	eval[bool](t, ctx, `window.loadedOnce = true`)
	waitAgree(t, ctx, time.Now(), agreeWithin, agreement(0, "worker-A/1"))

	// worker-A stalls past its TTL, worker-B takes the lease, worker-A
	// wakes up and writes.
	waitLeaseState(t, d.URL, a.LeaseID, "expired")
	acquire(t, d.URL, res, "worker-B", time.Hour)
	wantProblem(t, write(t, d.URL, "statements", "/lines", a, `{"line":2}`), 409, "stale_token")
	took := waitAgree(t, ctx, time.Now(), agreeWithin, agreement(1, "worker-B/2"))
	t.Logf("cards, chart, leases and feed agreed %v after the first 409", took.Round(time.Millisecond))

	// And again, at another moment than the page's poll.
	time.Sleep(1700 * time.Millisecond)
	wantProblem(t, write(t, d.URL, "statements", "/lines", a, `{"line":3}`), 409, "stale_token")
	took = waitAgree(t, ctx, time.Now(), agreeWithin, agreement(2, "worker-B/2"))
	t.Logf("... and %v after the second", took.Round(time.Millisecond))
	if reloaded := !eval[bool](t, ctx, `window.loadedOnce === true`); reloaded {
		t.Fatal("the overview was reloaded to agree")
	}
	dialogs.none(t, ctx)
}
