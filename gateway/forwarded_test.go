package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// headerRecorder is an upstream that keeps the headers and trailers of
// the last request it got.
type headerRecorder struct {
	*httptest.Server
	mu       sync.Mutex
	header   http.Header
	trailer  http.Header
	requests int
}

func newHeaderRecorder(t *testing.T) *headerRecorder {
	h := &headerRecorder{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h.mu.Lock()
		h.header, h.trailer = r.Header.Clone(), r.Trailer.Clone()
		h.requests++
		h.mu.Unlock()
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *headerRecorder) last() (http.Header, http.Header, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.header, h.trailer, h.requests
}

// X-Forwarded-Host is the gateway's word or absent,
// never the client's; a client's trailer fields go on, but not one the
// header rules drop (Fencing-Token), announced or sent
// (TestProxyForwardsRequestTrailers has the rest).
func TestForwardedHostAndTrailers(t *testing.T) {
	for _, checked := range []bool{false, true} {
		up := newHeaderRecorder(t)
		cfg := Config{}
		if checked {
			cfg.AllowedHosts = []string{"gw.example"}
		}
		tg := startFraming(t, up.URL, cfg, false)
		lease := tg.lease(t, "r")
		resp, _, body := tg.rawAnswer(t, "POST /v1/proxy/svc/x HTTP/1.1\r\nHost: gw.example\r\nFencing-Lease: "+lease+
			"\r\nX-Forwarded-Host: evil.example\r\nTrailer: Fencing-Token, X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"3\r\nabc\r\n0\r\nFencing-Token: 999\r\nX-Sum: 1\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		h, tr, n := up.last()
		if n != 1 {
			t.Fatalf("%d requests upstream", n)
		}
		want := ""
		if checked {
			want = "gw.example"
		}
		if got := h.Values("X-Forwarded-Host"); len(got) > 1 || h.Get("X-Forwarded-Host") != want {
			t.Errorf("Host check %v: X-Forwarded-Host %q, want %q", checked, got, want)
		}
		if len(tr) != 1 || tr.Get("X-Sum") != "1" || h.Get(HeaderToken) != "1" {
			t.Errorf("Host check %v: upstream got Trailer %q, trailers %v, token %q", checked, h.Get("Trailer"), tr, h.Get(HeaderToken))
		}
	}
}
