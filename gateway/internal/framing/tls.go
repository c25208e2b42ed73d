package framing

// TLS termination in the listener: the scanner must see plaintext,
// so the listener runs the handshake Go's server would run.

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
)

// handshake runs the TLS handshake that Go's server would run itself for a
// *tls.Conn, bounded the same way, and keeps its state for the requests.
func (c *conn) handshake() error {
	ctx := context.Background()
	if c.l.hsTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.l.hsTimeout)
		defer cancel()
	}
	if err := c.tlsConn.HandshakeContext(ctx); err != nil {
		reason := err.Error()
		var re tls.RecordHeaderError
		if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
			// Where net/http writes a plain-text 400, the gateway's
			// problem (the listener's refuse), naming no field.
			_, _ = re.Conn.Write(c.l.refuse(http.StatusBadRequest, "", "the client sent a plain HTTP request to a port that speaks HTTPS"))
			_ = c.Close() // lingering: the rest of the request is unread
			reason = "client sent an HTTP request to an HTTPS server"
		}
		if c.l.errorLog != nil {
			c.l.errorLog.Printf("http: TLS handshake error from %s: %v", c.RemoteAddr(), reason)
		}
		return err
	}
	st := c.tlsConn.ConnectionState()
	c.mu.Lock()
	c.tlsState = &st
	c.mu.Unlock()
	return nil
}

func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}
