package client

// Idempotency keys: setting one on a fenced write, and DoIdempotent, which
// retries a keyed write while its outcome is unknown.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
)

// HeaderIdempotencyKey carries a fenced write's idempotency key
// (draft-ietf-httpapi-idempotency-key-header), as a quoted string.
const HeaderIdempotencyKey = "Idempotency-Key"

// HeaderReplayed is "true" on an answer the gateway served from the record
// of an earlier attempt with the same key, without reaching the upstream.
const HeaderReplayed = "Idempotent-Replayed"

// NewIdempotencyKey returns a fresh random key (128 bits, hex): one per
// logical write, reused for every retry of that write.
func NewIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// SetIdempotencyKey sets req's Idempotency-Key to key, quoted as the
// header's grammar wants. key must be 1 to 255 printable ASCII characters.
func SetIdempotencyKey(req *http.Request, key string) {
	key = strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key)
	req.Header.Set(HeaderIdempotencyKey, `"`+key+`"`)
}

// Replayed reports whether resp was answered from the gateway's record of
// an earlier attempt with the same key (the write was applied once, by
// that attempt).
func Replayed(resp *http.Response) bool { return resp.Header.Get(HeaderReplayed) == "true" }

// IdempotentOptions tune DoIdempotent. The zero value is usable.
type IdempotentOptions struct {
	// Attempts bounds the tries, the first included (default 5).
	Attempts int
	// Backoff is the first pause between tries, doubled each time up to 2s,
	// or the gateway's Retry-After when it gives one (default 100ms).
	Backoff time.Duration
}

// DoIdempotent sends req as a fenced write under the lease (see Do) with an
// Idempotency-Key, and retries it with the same key while its outcome is
// unknown: the gateway got it but gave no answer (the connection broke,
// 502/504 from the upstream, 503), or the first attempt is still in flight
// (idempotency_key_in_progress). The gateway applies a key at most once:
// a retry is answered from its record of the first attempt (Replayed is
// then true) or, if that attempt was forwarded and no answer came, with
// ErrOutcomeUnknown, which DoIdempotent returns for the caller to decide.
//
// The key is req's own Idempotency-Key if it has one (set it with
// SetIdempotencyKey to retry a logical write across leases: the key's
// scope is the resource, not the lease), else a new one. The body is
// resent on every try: from req.GetBody if set (http.NewRequest sets it
// for in-memory bodies), else it is read into memory first.
//
// Refusals are not retried: ErrStale (a newer lease exists; the lease is
// lost), ErrLeaseLost, 4xx problems. Nor are the upstream's own answers,
// whatever their status: they are the outcome.
func (l *Lease) DoIdempotent(req *http.Request, opts IdempotentOptions) (*http.Response, error) {
	if opts.Attempts <= 0 {
		opts.Attempts = 5
	}
	if opts.Backoff <= 0 {
		opts.Backoff = 100 * time.Millisecond
	}
	getBody := req.GetBody
	if req.Body != nil && req.Body != http.NoBody && getBody == nil {
		b, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		getBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	if req.Header.Get(HeaderIdempotencyKey) == "" {
		req = req.Clone(req.Context())
		SetIdempotencyKey(req, NewIdempotencyKey())
	}
	hc := l.HTTPClient("")
	pause := opts.Backoff
	for attempt := 1; ; attempt++ {
		try := req.Clone(req.Context())
		if getBody != nil {
			body, err := getBody()
			if err != nil {
				return nil, err
			}
			try.Body = body
		}
		resp, err := hc.Do(try)
		if err == nil || attempt >= opts.Attempts || !retryable(err) {
			return resp, err
		}
		wait := pause
		var e *Error
		if errors.As(err, &e) && e.RetryAfter > 0 {
			wait = e.RetryAfter
		}
		pause = min(2*pause, 2*time.Second)
		t := time.NewTimer(wait)
		select {
		case <-req.Context().Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// retryable: no answer from the gateway, or one that leaves the key's
// outcome open (a retry then learns it from the record).
func retryable(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return e.Status == 0 || e.Code == CodeKeyInProgress || errors.Is(e, ErrUpstream) || e.Status == http.StatusServiceUnavailable
}
