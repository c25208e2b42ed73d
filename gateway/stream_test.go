package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

type sseEvent struct {
	ID, Event, Data string
}

// streamOf connects to the stream and sends its events on a channel until
// ctx ends.
func streamOf(t *testing.T, ctx context.Context, url, lastID string) <-chan sseEvent {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	out := make(chan sseEvent, 4096)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.Event != "" {
					out <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.ID = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.Event = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.Data = line[6:]
			}
		}
	}()
	return out
}

func newStreamGateway(t *testing.T) (*Gateway, *bolt.Store, string) {
	t.Helper()
	store, err := bolt.Open(t.TempDir()+"/fencegw.db", bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc := tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: log})
	g := New(svc, Config{Logger: log})
	srv := httptest.NewServer(g)
	t.Cleanup(func() {
		g.Close()
		srv.Close()
		_ = store.Close()
	})
	return g, store, srv.URL
}

// tally follows a stream and checks that every rejection id in (after,
// want] is delivered exactly once, one by one or inside a summary, in
// order.
type tally struct {
	events, summaries, covered int
	last                       int64
}

func (tl *tally) add(t *testing.T, ev sseEvent) {
	t.Helper()
	id, _ := strconv.ParseInt(ev.ID, 10, 64)
	switch ev.Event {
	case "rejection":
		if id <= tl.last {
			t.Fatalf("rejection %d after %d", id, tl.last)
		}
		tl.events++
		tl.covered++
		tl.last = id
	case "summary":
		var s streamSummary
		if err := json.Unmarshal([]byte(ev.Data), &s); err != nil {
			t.Fatal(err)
		}
		if s.FirstID <= tl.last || s.LastID != id || s.Count < 1 {
			t.Fatalf("summary %+v (id %s) after %d", s, ev.ID, tl.last)
		}
		tl.summaries++
		tl.covered += s.Count
		tl.last = id
	}
}

func TestStreamThrottlesAStormWithoutLosingCount(t *testing.T) {
	g, _, url := newStreamGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// streamOf returns once the response's head arrived, and the handler
	// subscribes before it sends the head: nothing published from here on
	// can be missed.
	events := streamOf(t, ctx, url+"/v1/rejections/stream", "")

	// The storm comes in waves of half the subscriber's buffer, each sent
	// once the stream has taken the one before: as fast as this machine
	// lets the stream keep up, without the lag that disconnects it.
	const storm, wave = 5000, streamBuffer / 2
	start := time.Now()
	go func() {
		for i := 1; i <= storm; i++ {
			g.Publish(tokens.Rejection{ID: int64(i), At: time.Now(), Resource: "r", Code: tokens.CodeStaleToken, Holder: "w"})
			if i%wave == 0 && !waitFeedTaken(ctx, g.feed) {
				return
			}
		}
	}()
	var tl tally
	for tl.last < storm {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("stream ended after %d", tl.last)
			}
			tl.add(t, ev)
		case <-ctx.Done():
			t.Fatalf("stream stalled at %d (%+v)", tl.last, tl)
		}
	}
	elapsed := time.Since(start)
	if tl.covered != storm {
		t.Fatalf("covered %d of %d rejections", tl.covered, storm)
	}
	// The throttle's bound is the behaviour under test; it grows with the
	// time the storm took, so a slow machine only loosens it.
	sent := tl.events + tl.summaries
	if limit := streamBurst + int(elapsed.Seconds()*streamRate) + 2; sent > limit {
		t.Fatalf("%d events in %v, want at most %d", sent, elapsed, limit)
	}
	t.Logf("%d rejections in %v: %d events + %d summaries", storm, elapsed.Round(time.Millisecond), tl.events, tl.summaries)
}

// waitFeedTaken waits until every subscriber of f has taken what was
// published to it, or ctx ends (false).
func waitFeedTaken(ctx context.Context, f *feed) bool {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		f.mu.Lock()
		queued := 0
		for ch := range f.subs {
			queued += len(ch)
		}
		f.mu.Unlock()
		if queued == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// The throttle on its own clock: a storm within one instant gets
// streamBurst events and one summary once a token is back, and each
// further second of storm at most streamRate events, whatever the
// machine's speed; every rejection is counted once, in order.
func TestThrottleHoldsItsRateOnItsClock(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	rec := httptest.NewRecorder()
	th := newThrottle(rec, func() time.Time { return now })
	id := int64(0)
	storm := func(n int) {
		for range n {
			id++
			if err := th.rejection(tokens.Rejection{ID: id, At: now, Resource: "r", Code: tokens.CodeStaleToken, Holder: "w"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	sent := func() (events, summaries int) {
		body := rec.Body.String()
		return strings.Count(body, "event: rejection\n"), strings.Count(body, "event: summary\n")
	}

	storm(1000)
	if ev, sum := sent(); ev != streamBurst || sum != 0 {
		t.Fatalf("a storm in one instant: %d events, %d summaries; want %d and none yet", ev, sum, streamBurst)
	}
	if d := th.untilToken(); d <= 0 || d > time.Second/streamRate {
		t.Fatalf("untilToken with an empty bucket = %v, want (0, %v]", d, time.Second/streamRate)
	}
	if err := th.summary(false); err != nil {
		t.Fatal(err)
	}
	if _, sum := sent(); sum != 0 {
		t.Fatal("a summary went out with an empty bucket")
	}
	now = now.Add(th.untilToken())
	if err := th.summary(false); err != nil {
		t.Fatal(err)
	}
	if ev, sum := sent(); ev != streamBurst || sum != 1 {
		t.Fatalf("once a token is back: %d events, %d summaries; want %d and 1", ev, sum, streamBurst)
	}

	// Ten more seconds of storm, in steps of 100 ms, the summary tried at
	// each step as the stream's loop does when its timer fires.
	for range 100 {
		now = now.Add(100 * time.Millisecond)
		storm(50)
		if err := th.summary(false); err != nil {
			t.Fatal(err)
		}
	}
	if err := th.summary(true); err != nil {
		t.Fatal(err)
	}
	ev, sum := sent()
	if limit := streamBurst + 1 + 10*streamRate + 1; ev+sum > limit {
		t.Fatalf("%d events and %d summaries over 10 s of storm, want at most %d", ev, sum, limit)
	}
	var tl tally
	sc := bufio.NewScanner(strings.NewReader(rec.Body.String()))
	var e sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if e.Event != "" {
				tl.add(t, e)
			}
			e = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			e.ID = line[4:]
		case strings.HasPrefix(line, "event: "):
			e.Event = line[7:]
		case strings.HasPrefix(line, "data: "):
			e.Data = line[6:]
		}
	}
	if tl.covered != int(id) || tl.last != id {
		t.Fatalf("covered %d of %d rejections, last id %d", tl.covered, id, tl.last)
	}
}

func TestStreamReplayAfterLastEventIDIsExactAndFiltered(t *testing.T) {
	_, store, url := newStreamGateway(t)
	// A bound, not a figure: 300 commits to disk, each a second or more
	// on a loaded machine's disk.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 300
	// Each its own incident (another token): repeats of one would be counted on one entry.
	for i := range n {
		res := "a"
		if i%3 == 0 {
			res = "b"
		}
		if _, err := store.RecordRejection(ctx, tokens.Rejection{Resource: res, Code: tokens.CodeStaleToken, Holder: "w", Token: int64(i + 1), CurrentToken: int64(i + 2)}); err != nil {
			t.Fatal(err)
		}
	}
	// Everything after id 100, throttled: 20 events, then one summary.
	var tl tally
	tl.last = 100
	events := streamOf(t, ctx, url+"/v1/rejections/stream", "100")
	for tl.last < n {
		tl.add(t, <-events)
	}
	if tl.covered != n-100 || tl.events != streamBurst || tl.summaries != 1 {
		t.Fatalf("replay: %+v", tl)
	}

	// ?after= for a first connection; Last-Event-ID wins on a reconnect.
	for _, c := range []struct{ query, header string }{{"?resource=b&after=250", ""}, {"?resource=b&after=1", "250"}} {
		tl = tally{last: 250}
		events = streamOf(t, ctx, url+"/v1/rejections/stream"+c.query, c.header)
		want := 0
		for i := 251; i <= n; i++ {
			if (i-1)%3 == 0 {
				want++
			}
		}
		for tl.covered < want {
			tl.add(t, <-events)
		}
		if tl.covered != want || tl.summaries != 0 {
			t.Fatalf("%s %s: %+v, want %d", c.query, c.header, tl, want)
		}
	}
}

// A bad event id, or a filter that could never match, is a 400 naming the
// parameter, not a stream that stays quiet.
func TestStreamRejectsBadParameters(t *testing.T) {
	_, _, url := newStreamGateway(t)
	for u, field := range map[string]string{
		"?after=x":                              "after",
		"?after=-1":                             "after",
		"?code=stale":                           "code",
		"?resource=a%20b":                       "resource",
		"?resource=" + strings.Repeat("r", 257): "resource",
		"?holder=%01":                           "holder",
	} {
		resp, err := http.Get(url + "/v1/rejections/stream" + u)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body), field) || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("%s: %d %s %s", u, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
}
