package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// A client that pipelines many GET /v1/openapi.yaml over a small receive
// buffer and never reads does not hold its connection (and its goroutine):
// the answer's write deadline ends it. Plain and TLS.
func TestUnreadAnswersDoNotHoldTheConnection(t *testing.T) {
	bothListeners(t, func(t *testing.T, tlsOn bool) {
		closed := make(chan struct{}, 16)
		tg := startFramingWith(t, "http://127.0.0.1:1", Config{WriteTimeout: 300 * time.Millisecond}, tlsOn,
			func(_ *bolt.Store, _ *Config, srv *http.Server) {
				srv.ConnState = func(_ net.Conn, s http.ConnState) {
					if s == http.StateClosed {
						closed <- struct{}{}
					}
				}
			})
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			})
		}}
		var c net.Conn
		c, err := d.Dial("tcp", tg.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if tlsOn {
			cfg := tg.tls.Clone()
			cfg.ServerName, cfg.NextProtos = "127.0.0.1", nil
			tc := tls.Client(c, cfg)
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			c = tc
		}
		// Padded so that Go's 4 KiB reads hold fewer heads than the framing
		// scanner queues (package framing's maxQueued).
		pipelined := strings.Repeat("GET /v1/openapi.yaml HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "+strings.Repeat("p", 200)+"\r\n\r\n", 200)
		go func() { _, _ = c.Write([]byte(pipelined)) }()
		select {
		case <-closed:
		case <-time.After(60 * time.Second): // without the deadline, never
			t.Fatal("the gateway still holds a connection whose client never reads")
		}
	})
}

// The live stream's write deadline rolls: a subscriber that reads keeps
// its stream past WriteTimeout, and gets events sent after it.
func TestStreamOutlivesTheWriteTimeout(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	tg := startFraming(t, "http://127.0.0.1:1", Config{WriteTimeout: writeTimeout}, false)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events := streamOf(t, ctx, "http://"+tg.addr+pathStream, "")
	for i := range 3 {
		<-time.After(2 * writeTimeout) // past the deadline of the events before
		tg.g.Publish(tokens.Rejection{ID: int64(i + 1), Resource: fmt.Sprint("r", i), Code: "lease_expired"})
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("the stream ended after %d events", i)
			}
			if ev.Event != "rejection" {
				t.Fatalf("event %+v", ev)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no event %d", i)
		}
	}
}

// The forward timeout is never early: the upstream connection's deadline
// is rounded up on a grid (gateway/internal/coarse), never down, and on a
// pooled connection whose last deadline rounds to a time already past is
// set again. A hung upstream's write gets its 504 no sooner than the
// forward timeout after the client sent it (and well before the upstream
// would have answered: the deadline is there at all). Timeouts of
// different grid steps, on a fresh connection and on a pooled one.
func TestForwardTimeoutIsNeverEarly(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.URL.Path == "/hang" {
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			}
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(release) })
	for _, timeout := range []time.Duration{90 * time.Millisecond, 250 * time.Millisecond, 700 * time.Millisecond} {
		t.Run(timeout.String(), func(t *testing.T) {
			tg := startFraming(t, up.URL, Config{ForwardTimeout: timeout}, false)
			c := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
			t.Cleanup(c.CloseIdleConnections)
			n := 0
			write := func(path string) (int, time.Duration) {
				// A resource of its own: a timed-out write's drains.
				n++
				req, _ := http.NewRequest("POST", "http://"+tg.addr+"/v1/proxy/svc"+path, strings.NewReader("b"))
				req.Header.Set(HeaderLease, tg.lease(t, fmt.Sprintf("r%d", n)))
				start := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode, time.Since(start)
			}
			// Fresh: the first write to the upstream dials.
			if code, took := write("/hang"); code != http.StatusGatewayTimeout || took < timeout || took > 10*time.Second {
				t.Fatalf("a hung forward on a fresh connection: %d after %v; want 504 after %v or more", code, took, timeout)
			}
			// Pooled: a write that ends leaves its connection, and its
			// deadline, in the pool; the next write's deadline is later.
			for i := range 3 {
				// On a loaded machine a write that ends can itself take
				// longer than 90 ms (a 504, its connection not pooled):
				// it is tried again, as the point is a pooled connection.
				for attempt := 1; ; attempt++ {
					code, _ := write("/fine")
					if code == 200 {
						break
					}
					if code != http.StatusGatewayTimeout || attempt == 5 {
						t.Fatalf("a write that ends: %d (attempt %d)", code, attempt)
					}
				}
				if code, took := write("/hang"); code != http.StatusGatewayTimeout || took < timeout || took > 10*time.Second {
					t.Fatalf("hung forward %d on a pooled connection: %d after %v; want 504 after %v or more", i, code, took, timeout)
				}
			}
		})
	}
}
