package e2e

// The resource page of a busy resource: 10,000 lease events, the incident
// among them. It must answer quickly (measured and logged, not asserted)
// and show the incident in the first screen.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/tokens"
)

// cycles grants and releases res n times as holder, through the service
// (the HTTP round trips would only slow the setup down).
func cycles(t *testing.T, svc *tokens.Service, res, holder string, n int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		l, err := svc.Acquire(ctx, tokens.AcquireRequest{Resource: res, Holder: holder, TTL: time.Minute})
		if err != nil {
			t.Fatalf("acquire %s: %v", res, err)
		}
		if _, err := svc.Release(ctx, l.ID, ""); err != nil {
			t.Fatalf("release %s: %v", res, err)
		}
	}
}

// timePage fetches path n times and returns the median and the slowest.
func timePage(t *testing.T, url string, n int) (median, slowest time.Duration) {
	t.Helper()
	var ds []time.Duration
	for range n {
		start := time.Now()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d", url, resp.StatusCode)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)-1]
}

// incidentInFirstScreen checks that the account and the refused write are
// visible without scrolling.
func incidentInFirstScreen(t *testing.T, ctx context.Context) {
	t.Helper()
	seen := eval[string](t, ctx, `(() => {
	  const h = window.innerHeight, out = [];
	  const a = document.getElementById('account');
	  out.push('account=' + (a ? a.getBoundingClientRect().bottom <= h : 'missing'));
	  const r = document.querySelector('#timeline li.rejected.incident');
	  out.push('rejected=' + (r ? r.getBoundingClientRect().bottom <= h : 'missing'));
	  return out.join(' ');
	})()`)
	if seen != "account=true rejected=true" {
		t.Errorf("in the first screen: %s, want the account and the refused write", seen)
	}
}

func TestBrowserResourceWith10000Events(t *testing.T) {
	ctx, _ := browser(t)
	up := newUpstream(t)
	d := startDashboard(t, map[string]string{"statements": up.URL})
	const res = "stmt:acct:40401"
	// A week of routine traffic, compressed: 4,929 grant/release cycles by
	// three workers.
	start := time.Now()
	for i := range 3 {
		cycles(t, d.svc, res, fmt.Sprintf("steady-%d", i+1), 1643)
	}
	t.Logf("embedded: 9,858 routine events recorded in %v", time.Since(start).Round(time.Millisecond))
	busyStory(t, ctx, "embedded", d.URL, res, func(n int) { cycles(t, d.svc, res, "steady-1", n) })
	screenshot(t, ctx, "resource", "resource-busy.png")
}

func TestBrowserResourceWith10000EventsPostgres(t *testing.T) {
	ctx, _ := browser(t)
	up := newUpstream(t)
	db := freshDatabase(t)
	base := serveReplica(t, "--postgres", db, "--upstream", "statements="+up.URL)
	const res = "stmt:acct:40402"
	l := acquire(t, base, res, "steady-1", time.Minute)
	do(t, "DELETE", base+"/v1/leases/"+l.LeaseID, nil)
	// The routine week goes straight into the history table (9,858 events,
	// tokens 2-4930, one cycle a second, ending a minute ago); the fence
	// moves to the last of those tokens.
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(c, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(c, `INSERT INTO lease_events (at, resource, kind, token, holder, expires_at)
		SELECT now() - interval '1 minute' - (4930 - tok) * interval '1 second' + k.off, $1, k.kind, tok,
		       'steady-' || (tok % 3 + 1), now() + interval '1 hour'
		FROM generate_series(2, 4930) tok,
		     (VALUES ('granted', interval '0'), ('released', interval '500 milliseconds')) k(kind, off)
		ORDER BY tok, k.off`, res); err != nil {
		t.Fatalf("insert history: %v", err)
	}
	if _, err := conn.Exec(c, `UPDATE fences SET token = 4930 WHERE resource = $1`, res); err != nil {
		t.Fatalf("move the fence: %v", err)
	}
	busyStory(t, ctx, "postgres", base, res, func(n int) {
		for range n {
			l := acquire(t, base, res, "steady-1", time.Minute)
			do(t, "DELETE", base+"/v1/leases/"+l.LeaseID, nil)
		}
	})
	screenshot(t, ctx, "resource", "")
}

// busyStory adds to res's routine history 40 quick cycles by warm-up, the
// incident and 9 cycles after it (more), then times the resource page and
// checks that its first screen tells the incident.
func busyStory(t *testing.T, ctx context.Context, mode, base, res string, more func(n int)) {
	t.Helper()
	for range 40 {
		l := acquire(t, base, res, "warm-up", time.Minute)
		do(t, "DELETE", base+"/v1/leases/"+l.LeaseID, nil)
	}
	w3 := acquire(t, base, res, "worker-3", 300*time.Millisecond)
	if a := write(t, base, "statements", "/lines", w3, `{"line":1}`); a.Status != 200 {
		t.Fatalf("worker-3 write: %d %s", a.Status, a.Body)
	}
	waitLeaseState(t, base, w3.LeaseID, "expired")
	w5 := acquire(t, base, res, "worker-5", time.Hour)
	for range 3 {
		wantProblem(t, write(t, base, "statements", "/lines", w3, `{"line":2}`), 409, "stale_token")
	}
	do(t, "DELETE", base+"/v1/leases/"+w5.LeaseID, nil)
	more(9)

	page := base + "/ui/resources/" + url.PathEscape(res)
	med, worst := timePage(t, page, 21)
	t.Logf("%s: the resource page of 10,000 events answers in %v (median of 21; slowest %v)", mode, med.Round(100*time.Microsecond), worst.Round(100*time.Microsecond))
	med, worst = timePage(t, base+"/ui/api/resources/"+url.PathEscape(res), 21)
	t.Logf("%s: its JSON in %v (median of 21; slowest %v)", mode, med.Round(100*time.Microsecond), worst.Round(100*time.Microsecond))

	within(t, ctx, 15*time.Second, "open resource", chromedp.Navigate(page))
	incidentInFirstScreen(t, ctx)
	rows := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('#timeline li')).slice(0, 8).map(li => li.textContent.replace(/\s+/g, ' ').trim())`)
	want := []string{
		"9 grants and 9 releases by steady-1",
		"worker-5 released token",
		"worker-3 wrote POST statements/lines with token",
		"worker-5 acquired token",
		"of worker-3 expired",
		"worker-3 acquired token",
		"40 grants and 40 releases by warm-up",
	}
	at := 0
	for _, w := range want {
		i := slices.IndexFunc(rows[at:], func(s string) bool { return strings.Contains(s, w) })
		if i < 0 {
			t.Fatalf("first rows lack %q after row %d:\n%s", w, at, strings.Join(rows, "\n"))
		}
		at += i + 1
	}
	account := eval[string](t, ctx, `document.getElementById('account').textContent.replace(/\s+/g, ' ').trim()`)
	for _, w := range []string{"worker-3 wrote with token", "after its lease expired", "worker-5 held the resource", "3 times until", "nothing reached the upstream"} {
		if !strings.Contains(account, w) {
			t.Errorf("account %q lacks %q", account, w)
		}
	}
}
