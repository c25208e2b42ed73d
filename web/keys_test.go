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
