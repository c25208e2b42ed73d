package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
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
)

// serveStream is GET /v1/rejections/stream: Server-Sent Events, one
// "rejection" event per refused write, replaying what a reconnecting client
// missed (Last-Event-ID) before going live.
func (g *Gateway) serveStream(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeProblem(w, r, g.log, errStreamUnsupported)
		return
	}
	resource := r.URL.Query().Get("resource")
	var lastID int64
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id < 0 {
			writeProblem(w, r, g.log, requestError("Last-Event-ID", "must be an event id sent by this stream"))
			return
		}
		lastID = id
	}
	// Subscribe before reading the backlog so nothing falls between the two.
	live, unsubscribe := g.feed.subscribe(streamBuffer)
	defer unsubscribe()
	g.obs.subs.Inc()
	defer g.obs.subs.Dec()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("retry: 1000\n\n"))

	replayed := map[int64]struct{}{}
	if lastID > 0 {
		backlog, err := g.svc.Rejections(r.Context(), tokens.RejectionQuery{Resource: resource, Limit: streamReplayMax})
		if err != nil {
			g.log.Warn("stream replay failed", "err", err)
			return // the client reconnects and tries again
		}
		for i := len(backlog) - 1; i >= 0; i-- {
			if backlog[i].ID > lastID {
				replayed[backlog[i].ID] = struct{}{}
				if writeEvent(w, backlog[i]) != nil {
					return
				}
			}
		}
	}
	flusher.Flush()

	heartbeat := time.NewTicker(streamHeartbeat)
	defer heartbeat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-heartbeat.C:
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
			flusher.Flush()
		case rej, ok := <-live:
			if !ok {
				return
			}
			if _, dup := replayed[rej.ID]; dup || (resource != "" && rej.Resource != resource) {
				continue
			}
			if writeEvent(w, rej) != nil {
				return
			}
			// Coalesce a burst into one flush.
			for drained := false; !drained; {
				select {
				case more, ok := <-live:
					if !ok {
						flusher.Flush()
						return
					}
					if resource == "" || more.Resource == resource {
						if writeEvent(w, more) != nil {
							return
						}
					}
				default:
					drained = true
				}
			}
			flusher.Flush()
		}
	}
}

var errStreamUnsupported = &tokens.Error{Kind: errRequest, Detail: "streaming is not supported on this connection"}

func writeEvent(w http.ResponseWriter, r tokens.Rejection) error {
	data, err := json.Marshal(rejectionJSON(r))
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(data)+64)
	buf = append(buf, "id: "...)
	buf = strconv.AppendInt(buf, r.ID, 10)
	buf = append(buf, "\nevent: rejection\ndata: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	_, err = w.Write(buf)
	return err
}
