package framing

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// watchingHandler watches its client for up to wait, then answers whether
// the watch saw it go (the answer may have no one to read it).
func watchingHandler(wait time.Duration, seen chan<- string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		server := "go"
		if _, ok := w.(*response); ok {
			server = "own"
		}
		ctx, stop := WatchClient(r.Context())
		t := time.NewTimer(wait)
		defer t.Stop()
		got := "stayed"
		select {
		case <-ctx.Done():
			got = "gone"
			if !errors.Is(context.Cause(ctx), ErrClientGone) && server == "own" {
				got = "gone, cause " + fmt.Sprint(context.Cause(ctx))
			}
		case <-t.C:
		}
		stop()
		seen <- server + " " + r.URL.Path + " " + got
		fmt.Fprint(w, got)
	})
}

// A request the loop serves that watches its client hears it go, closed
// or half-closed, as Go's server's requests do; one whose client stays is
// answered, and the connection serves the next request, pipelined or not.
func TestWatchClient(t *testing.T) {
	seen := make(chan string, 10)
	addr, _, _ := serveBoth(t, watchingHandler(300*time.Millisecond, seen), takesOwn, nil)
	dial := func() net.Conn { return dialFor(t, addr, 10*time.Second) }
	next := func() string { return nextSeen(t, seen) }
	for _, tc := range []struct{ name, method string }{{"own", "POST /own/"}, {"go", "GET /"}} {
		t.Run(tc.name+"/closed", func(t *testing.T) {
			c := dial()
			fmt.Fprintf(c, "%sclosed HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", tc.method)
			time.Sleep(50 * time.Millisecond)
			_ = c.Close()
			if got, want := next(), tc.name+" /"+pathOf(tc.method)+"closed gone"; got != want {
				t.Fatalf("got %q; want %q", got, want)
			}
		})
		t.Run(tc.name+"/half-closed", func(t *testing.T) {
			c := dial()
			fmt.Fprintf(c, "%shalf HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", tc.method)
			time.Sleep(50 * time.Millisecond)
			_ = c.(*net.TCPConn).CloseWrite()
			if got, want := next(), tc.name+" /"+pathOf(tc.method)+"half gone"; got != want {
				t.Fatalf("got %q; want %q", got, want)
			}
		})
	}
	t.Run("stays", func(t *testing.T) {
		// One at a time, then two pipelined: the second's bytes end the
		// first's watch without a word, and are its own request.
		oneThenTwoStay(t, dial(), "POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na",
			"POST /own/b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nbPOST /own/c HTTP/1.1\r\nHost: x\r\n\r\n")
		for _, want := range []string{"own /own/a stayed", "own /own/b stayed", "own /own/c stayed"} {
			if got := next(); got != want {
				t.Fatalf("got %q; want %q", got, want)
			}
		}
	})
}

// oneThenTwoStay sends one request on c, then two pipelined, and checks
// that each was answered "stayed" (its client did not go).
func oneThenTwoStay(t *testing.T, c net.Conn, one, two string) {
	t.Helper()
	br := bufio.NewReader(c)
	fmt.Fprint(c, one)
	if got := readAnswers(t, br, 1); got[0] != "200 stayed" {
		t.Fatalf("got %q", got)
	}
	fmt.Fprint(c, two)
	if got := readAnswers(t, br, 2); got[0] != "200 stayed" || got[1] != "200 stayed" {
		t.Fatalf("got %q", got)
	}
}

// dialFor dials addr, closed at the test's end, with a deadline of d.
func dialFor(t *testing.T, addr string, d time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(d))
	return c
}

// nextSeen is what a watching handler sent on seen when it ended.
func nextSeen[T any](t *testing.T, seen <-chan T) T {
	t.Helper()
	select {
	case v := <-seen:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not end")
		var zero T
		return zero
	}
}

func pathOf(method string) string {
	if method == "GET /" {
		return ""
	}
	return "own/"
}

// A request watched once is not watched again (one reader of the
// connection at a time): the second call gives the context as it is, and
// the first watch still hears the client go; stops may be called twice.
func TestWatchClientOnce(t *testing.T) {
	seen := make(chan string, 1)
	addr, _, _ := serveBoth(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		ctx, stop := WatchClient(r.Context())
		again, stopAgain := WatchClient(ctx)
		stopAgain()
		got := "watched again"
		if again == ctx {
			select {
			case <-ctx.Done():
				got = "gone"
			case <-time.After(5 * time.Second):
				got = "stayed"
			}
		}
		stop()
		stop()
		seen <- got
	}), takesOwn, nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "POST /own/twice HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na")
	time.Sleep(50 * time.Millisecond)
	_ = c.Close()
	if got := <-seen; got != "gone" {
		t.Fatalf("got %q; want the first watch to hear the client go, and no second watch", got)
	}
}

// WatchClientAfter watches from its delay on: a client that closes or
// half-closes its connection before the delay is heard then (not before),
// one that stays gets its answer and its connection serves the next
// request, pipelined or not, and a request over before the delay never
// watched (its stop ends the timer; the pipelined request behind it is
// served).
func TestWatchClientAfter(t *testing.T) {
	const delay = 150 * time.Millisecond
	type heard struct {
		got   string
		after time.Duration
	}
	seen := make(chan heard, 10)
	addr, _, _ := serveBoth(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		start := time.Now()
		ctx, stop := WatchClientAfter(r.Context(), delay)
		wait := 600 * time.Millisecond
		if r.URL.Path == "/own/quick" {
			wait = 0
		}
		timer := time.NewTimer(wait)
		defer timer.Stop()
		got := "stayed"
		select {
		case <-ctx.Done():
			got = "gone"
			if !errors.Is(context.Cause(ctx), ErrClientGone) {
				got = "gone, cause " + fmt.Sprint(context.Cause(ctx))
			}
		case <-timer.C:
		}
		stop()
		stop()
		seen <- heard{r.URL.Path + " " + got, time.Since(start)}
		fmt.Fprint(w, got)
	}), takesOwn, nil)
	dial := func() net.Conn { return dialFor(t, addr, 10*time.Second) }
	next := func() heard { return nextSeen(t, seen) }
	for _, end := range []string{"closed", "half-closed"} {
		t.Run(end, func(t *testing.T) {
			c := dial()
			fmt.Fprintf(c, "POST /own/%s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", end)
			time.Sleep(20 * time.Millisecond)
			if end == "closed" {
				_ = c.Close()
			} else {
				_ = c.(*net.TCPConn).CloseWrite()
			}
			h := next()
			if h.got != "/own/"+end+" gone" || h.after < delay {
				t.Fatalf("heard %q after %v; want the client gone, heard at the delay (%v) or later", h.got, h.after, delay)
			}
		})
	}
	t.Run("stays", func(t *testing.T) {
		oneThenTwoStay(t, dial(), "POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na",
			"POST /own/quick HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nbPOST /own/b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nc")
		for _, want := range []string{"/own/a stayed", "/own/quick stayed", "/own/b stayed"} {
			if h := next(); h.got != want {
				t.Fatalf("got %q; want %q", h.got, want)
			}
		}
	})
}

// ClientGone tells at once, with no watch running, a client that closed,
// half-closed or reset its connection from one that stays; a request Go's
// server serves is not the loop's to tell.
func TestClientGone(t *testing.T) {
	seen := make(chan string, 10)
	asked := make(chan struct{})
	addr, _, _ := serveBoth(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		<-asked // the client has done what it does
		got := "stays"
		if err := ClientGone(r.Context()); err != nil {
			got = err.Error()
		}
		seen <- r.URL.Path + " " + got
		fmt.Fprint(w, got)
	}), takesOwn, nil)
	for _, tc := range []struct {
		path, want string
		leave      func(c *net.TCPConn)
	}{
		{"/own/stays", "stays", func(*net.TCPConn) {}},
		{"/own/closed", ErrClientGone.Error(), func(c *net.TCPConn) { _ = c.Close() }},
		{"/own/half", ErrClientGone.Error(), func(c *net.TCPConn) { _ = c.CloseWrite() }},
		{"/own/reset", ErrClientGone.Error(), func(c *net.TCPConn) { _ = c.SetLinger(0); _ = c.Close() }},
		{"/go/closed", "stays", func(c *net.TCPConn) { _ = c.Close() }},
	} {
		t.Run(tc.path, func(t *testing.T) {
			c := dialFor(t, addr, 10*time.Second).(*net.TCPConn)
			method := "POST"
			if tc.path == "/go/closed" {
				method = "PUT" // not the loop's: Go's server serves it
			}
			fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", method, tc.path)
			time.Sleep(50 * time.Millisecond)
			tc.leave(c)
			time.Sleep(50 * time.Millisecond)
			asked <- struct{}{}
			if got, want := nextSeen(t, seen), tc.path+" "+tc.want; got != want {
				t.Fatalf("got %q; want %q", got, want)
			}
		})
	}
}
