package gateway

// The live rejection stream (GET /v1/rejections/stream): the in-process
// feed, the handler with its replay after Last-Event-ID and filters, and the
// throttle that folds a storm into summaries.

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// feed fans live rejections out to stream subscribers. Publishing never
// blocks: a subscriber that falls behind is disconnected, and its client
// reconnects with Last-Event-ID and replays the gap from the store.
type feed struct {
	mu     sync.Mutex
	subs   map[chan tokens.Rejection]struct{}
	closed bool
}

func newFeed() *feed { return &feed{subs: map[chan tokens.Rejection]struct{}{}} }

func (f *feed) publish(r tokens.Rejection) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.subs {
		select {
		case ch <- r:
		default:
			delete(f.subs, ch)
			close(ch)
		}
	}
}

// subscribe returns a channel of rejections, closed when the subscriber
// lags or the feed closes, and a func to unsubscribe.
func (f *feed) subscribe(buffer int) (<-chan tokens.Rejection, func()) {
	ch := make(chan tokens.Rejection, buffer)
	f.mu.Lock()
	if f.closed {
		close(ch)
	} else {
		f.subs[ch] = struct{}{}
	}
	f.mu.Unlock()
	return ch, func() {
		f.mu.Lock()
		if _, ok := f.subs[ch]; ok {
			delete(f.subs, ch)
			close(ch)
		}
		f.mu.Unlock()
	}
}

func (f *feed) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for ch := range f.subs {
		delete(f.subs, ch)
		close(ch)
	}
}

const (
	streamBuffer    = 1024
	streamHeartbeat = 15 * time.Second
	streamReplayMax = 1000
	// streamRate is the most events per second one client gets; past it,
	// rejections are folded into "summary" events. A storm of thousands of
	// stale writes a second must not flood a browser tab.
	streamRate = 20
	// streamBurst is how many events may go out back to back after a quiet
	// period.
	streamBurst = 20
)

// serveStream is GET /v1/rejections/stream: Server-Sent Events, one
// "rejection" event per refused write, replaying what a reconnecting client
// missed (Last-Event-ID, or ?after= for the first connection) before going
// live. Filters: ?resource=, ?holder=, ?code= (exact matches).
//
// Each client gets at most streamRate events a second. Past that, the
// rejections it would have got are counted into one "summary" event whose
// id is the last rejection it covers. Every rejection matching the filters
// is therefore either sent or counted, in id order, and a client that
// reconnects with the last id it saw resumes exactly after it.
// streamHeader is the live stream's header.
func streamHeader(h http.Header) {
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
}

func (g *Gateway) serveStream(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeProblem(w, r, g.log, errStreamUnsupported)
		return
	}
	// A rolling write deadline: each burst of events (the replay, a
	// heartbeat, a summary, live rejections) has WriteTimeout to go out,
	// so a subscriber that stops reading is dropped, one that reads stays.
	rc := http.NewResponseController(w)
	extend := func() { _ = rc.SetWriteDeadline(time.Now().Add(g.cfg.WriteTimeout)) }
	extend()
	if err := checkQuery(r, pathStream); err != nil { // strictquery.go
		writeProblem(w, r, g.log, err)
		return
	}
	q := r.URL.Query()
	filter := streamFilter{resource: q.Get("resource"), holder: q.Get("holder"), code: q.Get("code")}
	if err := g.checkStreamFilter(filter); err != nil {
		// A filter that can never match would look like a quiet stream.
		writeProblem(w, r, g.log, err)
		return
	}
	var lastID int64
	for _, c := range []struct{ name, value string }{{"Last-Event-ID", r.Header.Get("Last-Event-ID")}, {"after", q.Get("after")}} {
		if c.value == "" {
			continue
		}
		id, err := strconv.ParseInt(c.value, 10, 64)
		if err != nil || id < 0 {
			writeProblem(w, r, g.log, tokens.Invalid(c.name, "must be an event id sent by this stream"))
			return
		}
		lastID = id
		break // a reconnect's Last-Event-ID wins over the first connection's ?after=
	}
	if r.Method == http.MethodHead {
		// The head a GET would get, and no stream: a HEAD has no body to
		// hold open.
		streamHeader(w.Header())
		w.WriteHeader(http.StatusOK)
		return
	}
	release, err := g.streams.take(principalName(r.Context())) // streamcap.go
	if err != nil {
		writeProblem(w, r, g.log, err)
		return
	}
	defer release()
	// Subscribe before reading the backlog so nothing falls between the two.
	live, unsubscribe := g.feed.subscribe(streamBuffer)
	defer unsubscribe()
	g.metrics.subs.Inc()
	defer g.metrics.subs.Dec()

	streamHeader(w.Header())
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("retry: 1000\n\n"))

	out := newThrottle(w, time.Now)
	replayed := map[int64]int64{} // id -> the repeats the replay sent
	if lastID > 0 {
		backlog, err := g.svc.Rejections(r.Context(), tokens.RejectionQuery{Resource: filter.resource, Limit: streamReplayMax})
		if err != nil {
			g.log.Warn("stream replay failed", "err", err)
			return // the client reconnects and tries again
		}
		if n := len(backlog); n == streamReplayMax && backlog[n-1].ID > lastID+1 {
			// More was missed than one replay holds: say so rather than
			// pretend the replay is complete.
			out.pending.Gap = true
		}
		for i := len(backlog) - 1; i >= 0; i-- {
			rej := backlog[i]
			if rej.ID <= lastID {
				continue
			}
			replayed[rej.ID] = rej.Repeats
			if !filter.match(rej) {
				continue
			}
			if out.rejection(rej) != nil {
				return
			}
		}
		if out.summary(true) != nil {
			return
		}
	}
	flusher.Flush()

	heartbeat := time.NewTicker(streamHeartbeat)
	defer heartbeat.Stop()
	// summaryDue fires when a pending summary may go out; nil while none is
	// pending.
	var summaryDue <-chan time.Time
	for {
		select {
		case <-r.Context().Done():
			return
		case <-heartbeat.C:
			extend()
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
			flusher.Flush()
		case <-summaryDue:
			extend()
			summaryDue = nil
			if out.summary(false) != nil {
				return
			}
			flusher.Flush()
		case rej, ok := <-live:
			if !ok {
				return
			}
			extend()
			// Coalesce a burst into one flush.
			for {
				// A live event the replay already sent is skipped, but
				// not a later repeat counted on a replayed entry.
				if sent, dup := replayed[rej.ID]; (!dup || rej.Repeats > sent) && filter.match(rej) {
					if out.rejection(rej) != nil {
						return
					}
				}
				select {
				case rej, ok = <-live:
					if !ok {
						_ = out.summary(true)
						flusher.Flush()
						return
					}
					continue
				default:
				}
				break
			}
			flusher.Flush()
		}
		if out.pending.Count > 0 && summaryDue == nil {
			summaryDue = time.After(out.untilToken())
		}
	}
}

// streamFilter selects the rejections a client asked for.
type streamFilter struct{ resource, holder, code string }

func (f streamFilter) match(r tokens.Rejection) bool {
	return (f.resource == "" || r.Resource == f.resource) &&
		(f.holder == "" || r.Holder == f.holder) &&
		(f.code == "" || r.Code == f.code)
}

// streamSummary stands for rejections a client was not sent one by one.
type streamSummary struct {
	Count   int            `json:"count"`
	FirstID int64          `json:"first_id"`
	LastID  int64          `json:"last_id"`
	From    time.Time      `json:"from"`
	To      time.Time      `json:"to"`
	Codes   map[string]int `json:"codes"`
	// Gap: the client missed more than one replay holds; the rejection log
	// (GET /v1/rejections) has the rest.
	Gap bool `json:"gap,omitempty"`
}

// throttle writes a client's events with a token bucket of streamBurst
// events refilled at streamRate a second. While a summary is pending every
// rejection joins it, so ids go out in order.
type throttle struct {
	w       http.ResponseWriter
	now     func() time.Time
	tokens  float64
	last    time.Time
	pending streamSummary
	// maxID is the highest rejection id sent. A repeat counted on an
	// older entry is sent again with that entry's id, but the event's id
	// (the client's Last-Event-ID) never goes back, so a reconnect does
	// not replay what was already seen.
	maxID int64
}

func newThrottle(w http.ResponseWriter, now func() time.Time) *throttle {
	return &throttle{w: w, now: now, tokens: streamBurst, last: now()}
}

func (t *throttle) refill() {
	now := t.now()
	t.tokens = min(streamBurst, t.tokens+now.Sub(t.last).Seconds()*streamRate)
	t.last = now
}

// untilToken is how long until the bucket holds one event.
func (t *throttle) untilToken() time.Duration {
	t.refill()
	if t.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - t.tokens) / streamRate * float64(time.Second))
}

// rejection sends r, or counts it into the pending summary.
func (t *throttle) rejection(r tokens.Rejection) error {
	t.refill()
	if t.pending.Count == 0 && !t.pending.Gap && t.tokens >= 1 {
		t.tokens--
		t.maxID = max(t.maxID, r.ID)
		return writeEvent(t.w, r, t.maxID)
	}
	p := &t.pending
	if p.Count == 0 {
		p.FirstID, p.From, p.Codes = r.ID, r.At, map[string]int{}
	}
	p.Count++
	t.maxID = max(t.maxID, r.ID)
	p.LastID, p.To = t.maxID, r.At
	p.Codes[r.Code]++
	return nil
}

// summary sends the pending summary if there is one and the bucket allows
// (or force).
func (t *throttle) summary(force bool) error {
	if t.pending.Count == 0 && !t.pending.Gap {
		return nil
	}
	t.refill()
	if !force && t.tokens < 1 {
		return nil
	}
	t.tokens--
	data, err := json.Marshal(t.pending)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(data)+64)
	if t.pending.Count > 0 {
		buf = append(buf, "id: "...)
		buf = strconv.AppendInt(buf, t.pending.LastID, 10)
		buf = append(buf, '\n')
	}
	buf = append(buf, "event: summary\ndata: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	t.pending = streamSummary{}
	_, err = t.w.Write(buf)
	return err
}

var errStreamUnsupported = &tokens.Error{Kind: tokens.ErrInvalid, Detail: "streaming is not supported on this connection"}

func writeEvent(w http.ResponseWriter, r tokens.Rejection, eventID int64) error {
	data, err := json.Marshal(rejectionJSON(r))
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(data)+64)
	buf = append(buf, "id: "...)
	buf = strconv.AppendInt(buf, eventID, 10)
	buf = append(buf, "\nevent: rejection\ndata: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	_, err = w.Write(buf)
	return err
}

func (g *Gateway) checkStreamFilter(f streamFilter) error {
	limits := g.svc.Limits()
	if f.resource != "" {
		if err := limits.ValidateResource(f.resource); err != nil {
			return err
		}
	}
	if err := limits.ValidateHolder(f.holder); err != nil {
		return err
	}
	if f.code != "" && !slices.Contains(tokens.RejectionCodes, f.code) {
		return tokens.Invalid("code", "must be one of "+strings.Join(tokens.RejectionCodes, ", "))
	}
	return nil
}
