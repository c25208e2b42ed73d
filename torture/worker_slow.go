package torture

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// slowWrite sends one write whose body trickles (FaultSlowBody). It
// carries no Idempotency-Key: the gateway reads a keyed write's body
// before it admits it (the key is bound to the body), so only an unkeyed
// write is admitted while its body is still on the way.
func (w *worker) slowWrite(ctx context.Context, res string, lease leaseRef, granted time.Time) {
	cfg := w.cfg
	w.seq++
	id := w.holder + "." + strconv.Itoa(w.seq)
	w.trickle = cfg.SlowBodyMin + time.Duration(w.rng.Int64N(int64(max(cfg.SlowBodyMax-cfg.SlowBodyMin, 1))))
	gi := w.rng.IntN(len(cfg.Gateways))
	late := time.Since(granted) >= cfg.TTL
	sent := now()
	a := w.do(context.WithoutCancel(ctx), "POST", cfg.Gateways[gi]+"/v1/proxy/"+cfg.Upstream+WritePath(res), []byte(id),
		"Fencing-Lease", lease.LeaseID, "Content-Type", "text/plain", HeaderReplica, strconv.Itoa(gi))
	w.rec.Write(Write{ID: id, Resource: res, Token: lease.Token, Status: a.status, Code: a.code, Sent: sent, Returned: now(), Late: late, Attempt: 1})
}

// doTrickle sends req on a connection of its own, its head and half of
// body at once, the rest after pause (a slow client, FaultSlowBody), and
// reads the answer. The request is written unbuffered, so that the head
// reaches the gateway before the pause, as a slow client's would.
func (w *worker) doTrickle(req *http.Request, body []byte, pause time.Duration) (*http.Response, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(req.Context(), "tcp", req.URL.Host)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(w.cfg.Timeout))
	half := len(body) / 2
	req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body[:half]), &pauseReader{pause: pause}, bytes.NewReader(body[half:])))
	req.ContentLength = int64(len(body))
	req.Close = true
	if err := req.Write(unbuffered{c}); err != nil {
		_ = c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	resp.Body = closeBoth{resp.Body, c}
	return resp, nil
}

// pauseReader sleeps once, then ends.
type pauseReader struct{ pause time.Duration }

func (p *pauseReader) Read([]byte) (int, error) {
	time.Sleep(p.pause)
	return 0, io.EOF
}

// unbuffered is a writer that Request.Write does not wrap in a buffer (it
// is an io.ByteWriter), so that each piece goes to the connection at once.
type unbuffered struct{ net.Conn }

func (u unbuffered) WriteByte(b byte) error {
	_, err := u.Write([]byte{b})
	return err
}

type closeBoth struct {
	io.ReadCloser
	c net.Conn
}

func (b closeBoth) Close() error {
	_ = b.ReadCloser.Close()
	return b.c.Close()
}
