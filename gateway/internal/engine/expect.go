package engine

// Expect: 100-continue (RFC 9110 10.1.1), as the Transport does it: the
// request's head goes first, and its body only once the upstream sent 100
// Continue, or after ExpectContinueTimeout without an answer; a final
// answer instead of 100 is the answer, and the body is left unsent if the
// connection is then closed (sent otherwise, to keep the connection in
// step). The wait is the first Read of the body, on the goroutine that
// writes the request, as Request.Write flushes the head before a body that
// is not in memory; there is no second goroutine to hear the answer.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"os"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// expectsContinue reports whether req asks the upstream's leave to send
// its body (the Transport's condition: HTTP/1.1, a body, Expect naming
// 100-continue).
func expectsContinue(req *http.Request, fields wire.Fields) bool {
	if !req.ProtoAtLeast(1, 1) || req.Body == nil || req.Body == http.NoBody {
		return false
	}
	vs, _ := fields.Lookup("Expect")
	return len(vs) > 0 && httpguts.HeaderValuesContainsToken(vs[:1], "100-continue")
}

// errBodyNotSent: the upstream answered before it asked for the body and
// the connection closes, so the body is not sent.
var errBodyNotSent = errors.New("the upstream answered before the request body was sent")

// continueBody is the body of a request with Expect: 100-continue: its
// first Read waits for the upstream's leave.
type continueBody struct {
	io.ReadCloser
	ctx      context.Context
	c        *engineConn
	req      *http.Request
	e        *Transport
	deadline time.Time // the exchange's, zero if none
	got1xx   func(code int, header textproto.MIMEHeader) error
	waited   bool
	// final is the upstream's answer if it came instead of 100 Continue;
	// skipped: the body was then not sent.
	final   *http.Response
	skipped bool
}

func (b *continueBody) Read(p []byte) (int, error) {
	if !b.waited {
		b.waited = true
		if err := b.wait(); err != nil {
			return 0, err
		}
	}
	return b.ReadCloser.Read(p)
}

// wait returns nil once the body is to be sent.
func (b *continueBody) wait() error {
	c := b.c
	timeout := b.e.std.ExpectContinueTimeout
	if timeout <= 0 {
		return nil // the Transport's zero: no wait
	}
	if err := c.bw.Flush(); err != nil { // the head, if Request.Write left it
		return err
	}
	until := time.Now().Add(timeout)
	if !b.deadline.IsZero() && b.deadline.Before(until) {
		until = b.deadline
	}
	for {
		if err := b.setReadDeadline(until); err != nil {
			return err
		}
		_, err := c.br.Peek(1) // within the exchange's head budget (c.limit)
		if err := b.setReadDeadline(b.deadline); err != nil {
			return err
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && (b.deadline.IsZero() || until.Before(b.deadline)) {
				return nil // no answer in ExpectContinueTimeout: the body goes
			}
			return err
		}
		resp, err := readAnswer(c, b.req)
		if err != nil {
			return err
		}
		code := resp.StatusCode
		if code == http.StatusContinue || code > 101 && code < 200 {
			if err := c.heard1xx(); err != nil {
				return err
			}
			if b.got1xx != nil {
				if err := b.got1xx(code, textproto.MIMEHeader(resp.Header)); err != nil {
					return err
				}
			}
			if code == http.StatusContinue {
				return nil
			}
			continue // an informational answer: still waiting
		}
		b.final = resp
		if resp.Close || b.req.Close {
			b.skipped = true
			return errBodyNotSent
		}
		return nil
	}
}

// setReadDeadline sets c's read deadline to t (zero: none), unless the
// exchange's context ended (its abort must not be undone).
func (b *continueBody) setReadDeadline(t time.Time) error {
	_ = b.c.nc.SetReadDeadline(t)
	b.c.sock.Forget() // the next exchange's is set whatever it is
	if b.ctx.Err() != nil {
		_ = b.c.nc.SetDeadline(aLongTimeAgo)
		return context.Cause(b.ctx)
	}
	return nil
}
