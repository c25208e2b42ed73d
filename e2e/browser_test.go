package e2e

// Browser tests of the dashboard in real headless Chromium. (The rejection
// storm is measured by cmd/fencegw-storm.)

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/replica"
	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/tokens"
	"net/url"
)

// dash is a gateway on the embedded store with the dashboard mounted,
// built as cmd/fencegw builds it (replica.New: accepted-write counts,
// rejection totals, clocks).
type dash struct {
	URL string
	svc *tokens.Service
}

func startDashboard(t testing.TB, ups map[string]string, opts ...func(*replica.Config)) *dash {
	t.Helper()
	cfg := replica.Config{
		Mode:   storagemode.Config{Data: t.TempDir()},
		Live:   gateway.Live{Upstreams: upstreamURLs(t, ups)},
		Logger: slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(&cfg)
	}
	g := startReplica(t, cfg)
	return &dash{URL: g.URL, svc: g.r.Service()}
}

const chromiumPath = "/usr/bin/chromium"

// browser starts headless Chromium and returns a tab's context and a
// counter of the JavaScript dialogs (alert, confirm, prompt) its pages opened.
// Without Chromium the test is skipped, except under CI=true, where it
// fails.
func browser(t *testing.T) (context.Context, *dialogCounter) {
	t.Helper()
	path := chromiumPath
	if _, err := os.Stat(path); err != nil {
		if p, err := exec.LookPath("chromium"); err == nil {
			path = p
		} else if os.Getenv("CI") == "true" {
			t.Fatalf("chromium is required under CI=true: %v", err)
		} else {
			t.Skipf("chromium not installed (%v); set CI=true to make this a failure", err)
		}
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first Run starts the browser; it must not carry a timeout.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	dialogs := new(dialogCounter)
	events := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range events {
			if err != nil {
				return
			}
			if ev.Message == dialogMarker {
				dialogs.marked.Add(1)
			} else {
				dialogs.Add(1)
			}
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	return ctx, dialogs
}

// dialogCounter counts the dialogs a tab's pages opened, except the markers
// that settle opens.
type dialogCounter struct {
	atomic.Int32
	marked atomic.Int32
}

const dialogMarker = "fencegw-test-marker"

// none fails the test if any page of the tab opened a dialog. It opens a
// marker dialog and waits for it: Chromium reports a tab's dialogs in the
// order they open, so once the marker is counted, every dialog the pages
// opened before has been counted too.
func (d *dialogCounter) none(t *testing.T, ctx context.Context) {
	t.Helper()
	want := d.marked.Load() + 1
	eval[bool](t, ctx, `setTimeout(() => alert("`+dialogMarker+`"), 0), true`)
	for deadline := time.Now().Add(10 * time.Second); d.marked.Load() < want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the marker dialog was not reported within 10 s")
		}
	}
	if n := d.Load(); n != 0 {
		t.Fatalf("%d JavaScript dialogs opened", n)
	}
}

// within runs steps with a deadline, failing the test on error.
func within(t *testing.T, ctx context.Context, d time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := chromedp.Do(c, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// screenshot saves a full-page PNG as a test artifact (FENCEGW_ARTIFACTS or
// a temp dir) and, with FENCEGW_UPDATE_SCREENSHOTS=1, as docName under
// docs/screenshots/.
func screenshot(t *testing.T, ctx context.Context, name, docName string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := os.Getenv("FENCEGW_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+name+".png")
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", out)
	if docName != "" && os.Getenv("FENCEGW_UPDATE_SCREENSHOTS") == "1" {
		doc := filepath.Join("..", "docs", "screenshots", docName)
		if err := os.MkdirAll(filepath.Dir(doc), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(doc, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("updated %s", doc)
	}
}

// waitLive waits until the overview's feed is connected to the stream.
func waitLive(t *testing.T, ctx context.Context) {
	t.Helper()
	within(t, ctx, 10*time.Second, "feed goes live",
		chromedp.Poll[chromedp.Void](`document.getElementById('feed-status').textContent === 'live'`, chromedp.WithPollingInterval(20*time.Millisecond)))
}

// feedRowWith waits until a feed row's text contains s and returns how
// long that took.
func feedRowWith(t *testing.T, ctx context.Context, s string) time.Duration {
	t.Helper()
	start := time.Now()
	js := fmt.Sprintf(`Array.from(document.querySelectorAll('#feed tbody tr[data-id]')).some(tr => tr.textContent.includes(%q))`, s)
	within(t, ctx, 10*time.Second, "feed row with "+s,
		chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(10*time.Millisecond)))
	return time.Since(start)
}

func TestBrowserIncidentLiveFeedAndTimeline(t *testing.T) {
	ctx, dialogs := browser(t)
	up := newUpstream(t)
	d := startDashboard(t, map[string]string{"statements": up.URL})
	const res = "stmt:acct:88213"

	// worker-3 acquires, writes, then stalls past its TTL; worker-5 takes over.
	w3 := acquire(t, d.URL, res, "worker-3", 400*time.Millisecond)
	for i := range 3 {
		if a := write(t, d.URL, "statements", "/accounts/88213/lines", w3, fmt.Sprintf(`{"line":%d}`, i)); a.Status != 200 {
			t.Fatalf("worker-3 write: %d %s", a.Status, a.Body)
		}
	}
	waitLeaseState(t, d.URL, w3.LeaseID, "expired")
	w5 := acquire(t, d.URL, res, "worker-5", time.Hour)
	for i := range 2 {
		if a := write(t, d.URL, "statements", "/accounts/88213/lines", w5, fmt.Sprintf(`{"line":%d}`, 10+i)); a.Status != 200 {
			t.Fatalf("worker-5 write: %d %s", a.Status, a.Body)
		}
	}

	// Some background for the screenshots: a released lease written after
	// release, an expired one, a small burst of stale writes.
	inv := acquire(t, d.URL, "inventory/SKU-001", "restock-7", time.Minute)
	do(t, "DELETE", d.URL+"/v1/leases/"+inv.LeaseID, nil)
	wantProblem(t, write(t, d.URL, "statements", "/inventory/SKU-001", inv, `{"qty":3}`), 409, "lease_released")
	inv2 := acquire(t, d.URL, "inventory/SKU-001", "restock-8", 30*time.Minute)
	// restock-8's clock is 9 s behind: its renewal says so.
	if a := do(t, "POST", d.URL+"/v1/leases/"+inv2.LeaseID+"/renew", map[string]any{},
		gateway.HeaderClientTime, lyingClock(-9*time.Second, 2*time.Millisecond)); a.Status != 200 {
		t.Fatalf("renew: %d %s", a.Status, a.Body)
	}
	write(t, d.URL, "statements", "/inventory/SKU-001", inv2, `{"qty":5}`)
	inx := acquire(t, d.URL, "invoice:2291", "billing-2", 200*time.Millisecond)
	waitLeaseState(t, d.URL, inx.LeaseID, "expired")
	wantProblem(t, write(t, d.URL, "statements", "/invoices/2291/charge", inx, `{}`), 409, "lease_expired")

	within(t, ctx, 15*time.Second, "open overview", chromedp.Navigate(d.URL+"/ui/?range=15m"))
	waitLive(t, ctx)
	if n := eval[int](t, ctx, `document.querySelectorAll('#feed tbody tr[data-id]').length`); n != 2 {
		t.Fatalf("feed shows %d rows before the incident, want 2", n)
	}

	// worker-3 wakes up and writes: 409, and the open page shows it.
	stale := write(t, d.URL, "statements", "/accounts/88213/lines", w3, `{"line":99}`)
	wantProblem(t, stale, 409, "stale_token")
	took := feedRowWith(t, ctx, "worker-3")
	t.Logf("the stale write appeared in the live feed %v after its 409", took.Round(time.Millisecond))
	row := eval[string](t, ctx, `document.querySelector('#feed tbody tr[data-id]').textContent`)
	for _, want := range []string{res, "POST statements/accounts/88213/lines", "1 vs 2", "worker-3", "stale_token"} {
		if !strings.Contains(row, want) {
			t.Errorf("feed row %q lacks %q", row, want)
		}
	}
	for range 40 { // a burst, for the chart
		write(t, d.URL, "statements", "/accounts/88213/lines", w3, `{"line":100}`)
	}
	// The counts, chart and top lists follow the feed without a reload
	// (browser_agree_test.go checks how closely).
	within(t, ctx, 10*time.Second, "counts refresh without reload",
		chromedp.Poll[chromedp.Void](`document.getElementById('total-range').textContent === '43'`,
			chromedp.WithPollingInterval(50*time.Millisecond)))
	if bars := eval[int](t, ctx, `document.querySelectorAll('#live-overview-more svg rect.bar').length`); bars == 0 {
		t.Error("no chart bars after the refresh")
	}
	// The live feed explains an incident: its newest rows are on screen
	// without scrolling (the window is 1280×900, smaller than the
	// 1400×1000 an operator's screen has at least).
	if bottom := eval[float64](t, ctx, `window.scrollTo(0, 0), document.querySelector('#feed tbody tr').getBoundingClientRect().bottom - window.innerHeight`); bottom > 0 {
		t.Errorf("the live feed's newest row is %.0f px below the fold", bottom)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('#leases [data-expires]').length`); n != 2 {
		t.Errorf("leases with a countdown: %d, want 2", n)
	}
	// The countdown runs: its text changes without a reload.
	ttl1 := eval[string](t, ctx, `document.querySelector('#leases [data-expires]').textContent`)
	within(t, ctx, 10*time.Second, "TTL countdown moves from "+ttl1,
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelector('#leases [data-expires]').textContent !== %q`, ttl1),
			chromedp.WithPollingInterval(50*time.Millisecond)))
	within(t, ctx, 15*time.Second, "reload overview", chromedp.Navigate(d.URL+"/ui/?range=15m"))
	waitLive(t, ctx)
	screenshot(t, ctx, "overview", "overview.png")
	within(t, ctx, 10*time.Second, "phone width", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	screenshot(t, ctx, "overview-phone", "")
	if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > 420 {
		t.Errorf("overview is %d px wide at phone width", w)
	}
	within(t, ctx, 10*time.Second, "laptop width", chromedp.EmulateViewport(1280, 900))

	// The resource page tells the story newest first, the account on top.
	within(t, ctx, 15*time.Second, "open resource", chromedp.Navigate(d.URL+"/ui/resources/"+url.PathEscape(res)))
	account := eval[string](t, ctx, `document.getElementById('account').textContent.replace(/\s+/g, ' ').trim()`)
	for _, w := range []string{"worker-3 wrote with token 1", "after its lease expired", "worker-5 held the resource with token 2",
		"refused stale_token, 41 times until", "nothing reached the upstream"} {
		if !strings.Contains(account, w) {
			t.Errorf("account %q lacks %q", account, w)
		}
	}
	steps := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('#timeline li')).map(li => li.textContent.replace(/\s+/g, ' ').trim())`)
	want := []string{
		"worker-3 wrote POST statements/accounts/88213/lines with token 1: rejected stale_token, current token 2",
		"worker-5 acquired token 2",
		"token 1 of worker-3 expired",
		"worker-3 acquired token 1",
	}
	at := 0
	for _, w := range want {
		i := slices.IndexFunc(steps[at:], func(s string) bool { return strings.Contains(s, w) })
		if i < 0 {
			t.Fatalf("timeline lacks %q after step %d:\n%s", w, at, strings.Join(steps, "\n"))
		}
		at += i + 1
	}
	if !strings.Contains(steps[len(steps)-1], "3 writes accepted") {
		t.Errorf("grant of token 1 does not show its 3 accepted writes: %q", steps[len(steps)-1])
	}
	if !strings.Contains(steps[0], "×41") {
		t.Errorf("the burst is not folded into one step: %q", steps[0])
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('#timeline li.incident').length`); n != 4 {
		t.Errorf("%d steps marked as the incident, want 4 (the refusals, the new grant, the expiry, the stale token's grant)", n)
	}
	screenshot(t, ctx, "resource", "resource.png")
	dialogs.none(t, ctx)
}

func TestBrowserNamesFromClientsRenderAsText(t *testing.T) {
	ctx, dialogs := browser(t)
	up := newUpstream(t)
	d := startDashboard(t, map[string]string{"up": up.URL})
	const evil = `<script>alert("holder")</script><img src=x onerror=alert(2)>`
	const res = "inventory/SKU-9" // names cannot hold markup; the path and the holder can

	old := acquire(t, d.URL, res, evil, 200*time.Millisecond)
	waitLeaseState(t, d.URL, old.LeaseID, "expired")
	acquire(t, d.URL, res, "fresh", time.Hour)

	within(t, ctx, 15*time.Second, "open overview", chromedp.Navigate(d.URL+"/ui/"))
	waitLive(t, ctx)
	// Live: the row is built by app.js.
	a := do(t, "POST", d.URL+"/v1/proxy/up/x/%3Cscript%3Ealert(3)%3C%2Fscript%3E", "{}", gateway.HeaderLease, old.LeaseID)
	wantProblem(t, a, 409, "stale_token")
	feedRowWith(t, ctx, evil)
	if !strings.Contains(eval[string](t, ctx, `document.querySelector('#feed tbody tr[data-id]').textContent`), `<script>alert(3)</script>`) {
		t.Error("the path is not shown as text")
	}
	markup := `document.querySelectorAll('main script, main img, main b img').length`
	if n := eval[int](t, ctx, markup); n != 0 {
		t.Fatalf("%d elements injected by the live feed", n)
	}
	// Server-rendered: the overview (also filtered by the evil holder, which
	// lands in an input's value), the resource page, a markup resource URL.
	for _, path := range []string{
		"/ui/",
		"/ui/?holder=" + url.QueryEscape(evil),
		"/ui/resources/" + url.PathEscape(res),
		"/ui/resources/%3Cscript%3Ealert(4)%3C%2Fscript%3E",
	} {
		within(t, ctx, 15*time.Second, "open "+path, chromedp.Navigate(d.URL+path))
		if n := eval[int](t, ctx, markup); n != 0 {
			t.Fatalf("%s: %d injected elements", path, n)
		}
		body := eval[string](t, ctx, `document.body.textContent`)
		if path != "/ui/resources/%3Cscript%3Ealert(4)%3C%2Fscript%3E" && !strings.Contains(body, evil) {
			t.Errorf("%s does not show the holder as text", path)
		}
	}
	dialogs.none(t, ctx)
	screenshot(t, ctx, "escaped", "")
}
