package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fencegw/fencegw/replica"
)

// On an upstream that only observes, a write under a released lease is
// forwarded, and the open dashboard's live feed shows it in its own colour,
// saying that nothing was blocked; a refusal on an enforcing upstream
// beside it keeps the refusal's look.
func TestBrowserObservedWriteIsMarked(t *testing.T) {
	ctx, _ := browser(t)
	up := newUpstream(t)
	d := startDashboard(t, map[string]string{"observed": up.URL, "enforced": up.URL},
		func(c *replica.Config) { c.Live.Observe = map[string]bool{"observed": true} })
	old := acquire(t, d.URL, "ledger/7", "worker-old", time.Hour)
	do(t, "DELETE", d.URL+"/v1/leases/"+old.LeaseID, nil)

	within(t, ctx, 15*time.Second, "open overview", chromedp.Navigate(d.URL+"/ui/?range=15m"))
	waitLive(t, ctx)
	if a := write(t, d.URL, "observed", "/entries", old, `{"n":1}`); a.Status != http.StatusOK {
		t.Fatalf("write to the observing upstream: %d %s, want it forwarded", a.Status, a.Body)
	}
	feedRowWith(t, ctx, "nothing was blocked")
	wantProblem(t, write(t, d.URL, "enforced", "/entries", old, `{"n":2}`), 409, "lease_released")
	feedRowWith(t, ctx, "POST enforced/entries")

	rows := eval[[]map[string]string](t, ctx, `Array.from(document.querySelectorAll('#feed tbody tr[data-id]')).map(tr => ({
		text: tr.textContent, cls: tr.className, bg: getComputedStyle(tr.cells[0]).backgroundColor}))`)
	if len(rows) != 2 {
		t.Fatalf("feed rows %v, want 2", rows)
	}
	enforced, observed := rows[0], rows[1] // newest first
	if !strings.Contains(observed["text"], "observed/entries") || !strings.Contains(observed["cls"], "observed") ||
		!strings.Contains(observed["text"], "would refuse") || !strings.Contains(observed["text"], "lease_released") {
		t.Errorf("observed row %v: want its class, the code and 'would refuse'", observed)
	}
	if strings.Contains(enforced["text"], "nothing was blocked") || strings.Contains(enforced["cls"], "observed") {
		t.Errorf("enforced row %v is marked as observed", enforced)
	}
	if observed["bg"] == enforced["bg"] {
		t.Errorf("observed and refused rows share the colour %s", observed["bg"])
	}
	if n := len(up.seen()); n != 1 {
		t.Errorf("upstream got %d writes, want the observed one only", n)
	}
	// After a reload the row is server-rendered, marked the same way.
	within(t, ctx, 15*time.Second, "reload", chromedp.Navigate(d.URL+"/ui/?range=15m"))
	if !eval[bool](t, ctx, `!!document.querySelector('#feed tbody tr.observed .observed-note')`) {
		t.Error("the server-rendered feed does not mark the observed write")
	}
}
