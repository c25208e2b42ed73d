package web

import (
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// A retry with an Idempotency-Key is a row of the timeline that names the
// write it refers to: "replayed 201 from the write of 00:41:20.000".
func TestTimelineShowsReplaysWithTheirWrite(t *testing.T) {
	src := incident()
	const res = "stmt:acct:88213"
	t0 := time.Date(2026, 3, 1, 0, 41, 0, 0, time.UTC)
	write := t0.Add(20 * time.Second)
	src.events = append(src.events,
		tokens.Event{At: t0.Add(45 * time.Second), Resource: res, Kind: tokens.EventReplayed, Token: 34, Holder: "worker-5",
			Key: &tokens.KeyEvent{Upstream: "statements", Key: "<line-7>", Principal: "billing", WriteAt: write, WriteToken: 33, Status: 201}},
		tokens.Event{At: t0.Add(46 * time.Second), Resource: res, Kind: tokens.EventRetryRefused, Token: 34, Holder: "worker-5",
			Key: &tokens.KeyEvent{Upstream: "statements", Key: "line-8", WriteAt: t0.Add(41 * time.Second), WriteToken: 34, Code: tokens.CodeOutcomeUnknown}},
		tokens.Event{At: t0.Add(47 * time.Second), Resource: res, Kind: tokens.EventRetryRefused, Token: 34, Holder: "worker-5",
			Key: &tokens.KeyEvent{Upstream: "statements", Key: "line-9", WriteAt: t0.Add(42 * time.Second), WriteToken: 34, Code: tokens.CodeKeyMismatch}},
	)
	h := Handler(src, NewCounts())
	resp, body := get(t, h, "/ui/resources/stmt%3Aacct%3A88213")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	want := []string{
		`class="step retry_refused"`, `<code class="key">line-9</code>`, "idempotency_key_mismatch", "the key's write of", "00:41:42.000", "was another request",
		`class="step retry_refused"`, `<code class="key">line-8</code>`, "idempotency_outcome_unknown", "the write of", "00:41:41.000", "may have landed and is not forwarded again",
		`class="step replayed"`, "worker-5", "(presented by key billing)", `<code class="key">&lt;line-7&gt;</code>`, "on statements with token 34",
		"<b>replayed</b> 201 from the write of", `datetime="2026-03-01T00:41:20Z"`, "00:41:20.000", "(token 33)", "nothing reached the upstream",
	}
	at := 0
	for _, w := range want {
		i := strings.Index(body[at:], w)
		if i < 0 {
			t.Fatalf("timeline lacks %q after offset %d:\n%s", w, at, body[at:])
		}
		at += i
	}
	if strings.Contains(body, "<line-7>") {
		t.Fatal("the key is not escaped")
	}
	// The same write under the same token: no "(token N)".
	if i := strings.Index(body, "line-8"); strings.Contains(body[i:i+400], "(token 34)") {
		t.Errorf("the refused retry names the token it came under twice: %s", body[i:i+400])
	}
	_, js := get(t, h, "/ui/api/resources/stmt:acct:88213")
	for _, w := range []string{`"kind":"retry_refused"`, `"kind":"replayed"`, `"idempotency":{"key":"\u003cline-7\u003e","write_at":"2026-03-01T00:41:20Z","write_token":33,"status":201}`,
		`"upstream":"statements"`, `"principal":"billing"`} {
		if !strings.Contains(js, w) {
			t.Errorf("timeline JSON lacks %s: %s", w, js)
		}
	}
}

// A client retrying one key in a loop is one row with a count; another
// outcome of the same key, or another holder, is a row of its own.
func TestTimelineFoldsRepeatedRetries(t *testing.T) {
	src := incident()
	const res = "stmt:acct:88213"
	t0 := time.Date(2026, 3, 1, 0, 41, 45, 0, time.UTC)
	write := t0.Add(-5 * time.Second)
	ev := func(at time.Duration, holder string, kind tokens.EventKind, code string) tokens.Event {
		k := &tokens.KeyEvent{Upstream: "statements", Key: "line-7", WriteAt: write, WriteToken: 34, Code: code}
		if kind == tokens.EventReplayed {
			k.Status = 201
		}
		return tokens.Event{At: t0.Add(at), Resource: res, Kind: kind, Token: 34, Holder: holder, Key: k}
	}
	for i := range 5 {
		src.events = append(src.events, ev(time.Duration(i)*time.Second, "worker-5", tokens.EventReplayed, ""))
	}
	src.events = append(src.events, ev(6*time.Second, "worker-6", tokens.EventReplayed, ""),
		ev(7*time.Second, "worker-6", tokens.EventRetryRefused, tokens.CodeKeyMismatch))
	_, body := get(t, Handler(src, NewCounts()), "/ui/resources/stmt%3Aacct%3A88213")
	if n := strings.Count(body, `class="step replayed"`); n != 2 {
		t.Fatalf("%d replayed rows, want 2 (worker-5's five folded, worker-6's one):\n%s", n, body)
	}
	if n := strings.Count(body, `class="step retry_refused"`); n != 1 {
		t.Fatalf("%d refused-retry rows, want 1", n)
	}
	if !strings.Contains(body, "×5 until 00:41:49.000") || strings.Count(body, "×") != 2 {
		t.Fatalf("worker-5's five replays are not one row ×5 (and only it and the rejections folded):\n%s", body)
	}
}
