package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// Idempotent writes: the Idempotency-Key header of
// draft-ietf-httpapi-idempotency-key-header on fenced writes. The rules
// are tokens.Idempotency's (tokens/idempotency.go); this file is the HTTP
// side, hooked into serveProxy at four points:
//
//  1. before Admit, keyedWrite parses the key, so that a bad key is a 400;
//     after Admit (the lease is judged before any of the body is read, as
//     for a write without a key: a refused write must not cost the gateway
//     its body), readKeyedBody reads the body, whose digest is part of the
//     fingerprint;
//  2. then beginKeyed records the key as in progress, or answers from the
//     record (replay, 422, 409);
//  3. recordKeyed (called by the direct forward) records the upstream's
//     answer before any of it goes back to the client;
//  4. endKeyed, when the forward ended without an answer, records an
//     unknown outcome (the request left) or drops the key (it never did).
//
// A write without the header costs one map lookup at point 1 and a nil
// check at points 3 and 4: no allocation, no store call.

// Header names of idempotent writes.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderReplayed marks an answer served from the record of an earlier
	// attempt with the same key, without reaching the upstream.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted marks a replay whose recorded answer's body was
	// too large to keep: status and headers are the upstream's, the body
	// is empty.
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
)

// keyed is one write with an idempotency key.
type keyed struct {
	key         string
	fingerprint string
	// body is the whole request body, read for the fingerprint, which the
	// forward sends (nil if there is none).
	body  []byte
	claim *tokens.Claim // set once the key is this write's to forward
}

// keys is the gateway's idempotency state; nil without
// Config.Idempotency.
type keys struct {
	x     *tokens.Idempotency
	log   *slog.Logger
	count map[string]prometheus.Counter
}

// Label values of fencegw_idempotent_writes_total.
const (
	keyRecorded   = "recorded" // first attempt answered and recorded
	keyReplayed   = "replayed" // answered from the record
	keyMismatch   = "mismatch" // 422
	keyInProgress = "in_progress"
	keyUnknown    = "outcome_unknown" // a retry of an unknown outcome (409)
	keyLost       = "unknown"         // a first attempt that got no answer
	keyDropped    = "dropped"         // never left, or the upstream did not process it
	keyStoreError = "store_error"     // the answer's record was not written in time (retried in the background)
)

func newKeys(x *tokens.Idempotency, reg prometheus.Registerer, log *slog.Logger) *keys {
	if x == nil {
		return nil
	}
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencegw_idempotent_writes_total",
		Help: "Fenced writes with an Idempotency-Key by result: recorded (forwarded, answer recorded), replayed, mismatch (422), in_progress (409), outcome_unknown (409: a retry of a write whose outcome is unknown), unknown (a first attempt that got no answer), dropped (never left, or the upstream did not process it), store_error (the answer's record was not written in time, and is retried in the background).",
	}, []string{"result"})
	reg.MustRegister(vec)
	k := &keys{x: x, log: log, count: map[string]prometheus.Counter{}}
	for _, r := range []string{keyRecorded, keyReplayed, keyMismatch, keyInProgress, keyUnknown, keyLost, keyDropped, keyStoreError} {
		k.count[r] = vec.WithLabelValues(r)
	}
	return k
}

// keyedWrite is hook 1. It returns nil, true for a write without a key;
// false if it answered (a bad key).
// wf is r's header as the road reads it (writefields.go).
func (g *Gateway) keyedWrite(w http.ResponseWriter, r *http.Request, wf *writeFields) (*keyed, bool) {
	vs, ok := wf.idempotencyKey, wf.hasKey
	if !ok {
		return nil, true
	}
	fail := func(err error) (*keyed, bool) {
		g.metrics.write(outcomeBadRequest)
		writeProblem(w, r, g.log, err)
		return nil, false
	}
	if g.keys == nil {
		return fail(tokens.Invalid(HeaderIdempotencyKey, "idempotency keys are not enabled on this gateway"))
	}
	key, err := parseIdempotencyKey(vs)
	if err != nil {
		return fail(err)
	}
	return &keyed{key: key}, true
}

// readKeyedBody is the rest of hook 1, once the write was admitted: it
// reads the body and sets k's fingerprint; false if it answered (a body
// too large, too slow or broken).
func (g *Gateway) readKeyedBody(w http.ResponseWriter, r *http.Request, rawPath string, k *keyed) bool {
	fail := func(err error) bool {
		g.metrics.write(outcomeBadRequest)
		writeProblem(w, r, g.log, err)
		return false
	}
	var body []byte
	var err error
	if r.Body != nil && r.Body != http.NoBody {
		body, err = io.ReadAll(r.Body)
		if err != nil {
			var maxBytes *http.MaxBytesError
			if errors.As(err, &maxBytes) || errors.Is(err, problems.ErrRequestTimeout) {
				return fail(err)
			}
			return fail(tokens.Invalid("body", "could not be read: "+err.Error()))
		}
		_ = r.Body.Close()
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		r.TransferEncoding = nil
		if len(body) == 0 {
			r.Body = http.NoBody
		} else {
			k.body = body
		}
	}
	k.fingerprint = tokens.Fingerprint(r.Method, rawPath, r.URL.RawQuery, sha256.Sum256(body))
	return true
}

// parseIdempotencyKey reads the header's value: one sf-string (RFC 8941
// 3.3.3), "like this", of 1 to 255 printable ASCII characters, without
// parameters.
func parseIdempotencyKey(vs []string) (string, error) {
	bad := func(detail string) (string, error) { return "", tokens.Invalid(HeaderIdempotencyKey, detail) }
	if len(vs) != 1 {
		return bad("must be sent once")
	}
	v := strings.Trim(vs[0], " \t")
	if len(v) < 2 || v[0] != '"' {
		return bad(`must be a quoted string, like "8e03978e-40d5-43e8-bc93-6894a57f9324"`)
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return bad(`a backslash may only escape " or \`)
			}
			i++
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return bad("must be a single quoted string, without parameters")
			}
			key := b.String()
			if err := tokens.ValidKey(key); err != nil {
				return "", tokens.Invalid(HeaderIdempotencyKey, tokens.ErrorOf(err).Detail)
			}
			return key, nil
		case c < 0x20 || c > 0x7e:
			return bad("must be printable ASCII")
		default:
			b.WriteByte(c)
		}
	}
	return bad("the quoted string is not closed")
}

// beginKeyed is hook 2, after Admit: it returns true if the write is to be
// forwarded, false if it was answered from the record or refused (the
// caller ends the permit).
func (g *Gateway) beginKeyed(w http.ResponseWriter, r *http.Request, k *keyed, permit *tokens.Permit, upstream string) bool {
	scope := tokens.KeyScope{Resource: permit.Lease.Resource, Upstream: upstream, Principal: principalName(r.Context()), Key: k.key}
	// Bounded by the forward timeout: what precedes the forward waits for
	// the store no longer than the forward itself may wait for the
	// upstream (a stalled store answers 503 store_unavailable then).
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.ForwardTimeout)
	claim, rec, err := g.keys.x.Begin(ctx, scope, k.fingerprint, permit.Lease)
	cancel()
	switch {
	case err != nil:
		switch {
		case errors.Is(err, tokens.ErrKeyMismatch):
			g.keys.count[keyMismatch].Inc()
		case errors.Is(err, tokens.ErrKeyInProgress):
			g.keys.count[keyInProgress].Inc()
		case errors.Is(err, tokens.ErrOutcomeUnknown):
			g.keys.count[keyUnknown].Inc()
		default:
			g.metrics.refused(r.Context(), err)
		}
		writeProblem(w, r, g.log, err)
		return false
	case rec != nil:
		g.keys.count[keyReplayed].Inc()
		replay(w, rec)
		return false
	}
	k.claim = claim
	return true
}

// replay answers from a completed record.
func replay(w http.ResponseWriter, rec *tokens.KeyRecord) {
	h := w.Header()
	for name, vs := range rec.Header {
		h[name] = vs
	}
	h.Set(HeaderReplayed, "true")
	if rec.BodyOmitted {
		h.Set(HeaderBodyOmitted, "true")
	}
	h.Set("Content-Length", strconv.Itoa(len(rec.Body)))
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body)
}

// answerRecordWait bounds how long an upstream's answer to a keyed write
// waits for its record before it goes back. A healthy store records it in
// milliseconds, so that the answer a client sees is one a retry finds
// replayed; a stalled or refusing one must not hold the answer, whose
// record then goes on in the background.
const answerRecordWait = time.Second

// recordKeyed is hook 3, called by the direct forward: it reads up to the replay limit of the upstream's body and
// records the answer before any of it goes to the client (waiting for the
// store at most answerRecordWait). A body that fails to arrive is an
// unknown outcome (the error goes to forwardFailed). A write without a
// claimed key passes as it is.
func (g *Gateway) recordKeyed(ctx context.Context, f *forward, resp *http.Response) error {
	if f.keyed == nil || f.keyed.claim == nil {
		return nil
	}
	limit := g.keys.x.MaxBody()
	head, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	if err != nil {
		return err
	}
	omitted := len(head) > limit
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), answerRecordWait)
	defer cancel()
	if err := f.keyed.claim.Complete(ctx, resp.StatusCode, replayHeader(resp.Header), head, omitted); err != nil {
		// The answer still goes back: the write happened. The record is
		// retried in the background; until it lands the key is in
		// progress (and unknown past its deadline), so a retry is never
		// forwarded.
		g.keys.count[keyStoreError].Inc()
		g.log.Error("could not record the answer of an idempotent write in time; answering, and recording it in the background", "resource", f.permit.Lease.Resource, "err", err)
	} else if tokens.Unprocessed(resp.StatusCode) {
		g.keys.count[keyDropped].Inc()
	} else {
		g.keys.count[keyRecorded].Inc()
	}
	resp.Body = &rereadBody{Reader: io.MultiReader(bytes.NewReader(head), resp.Body), Closer: resp.Body}
	return nil
}

type rereadBody struct {
	io.Reader
	io.Closer
}

// endKeyed is hook 4, when the forward is over: a first attempt that got
// no recorded answer is an unknown outcome if its request may have left,
// and is dropped if it certainly did not. Both are recorded in the
// background (tokens.Claim.Unknown, Drop): the client's answer (a 504, a
// 502) does not wait for the store, and the key stays in progress, so
// that a retry is refused, until the record lands.
func (g *Gateway) endKeyed(f *forward) {
	c := f.keyed.claim
	if c == nil || c.Finished() {
		return
	}
	if f.unknown || !f.failed {
		g.keys.count[keyLost].Inc()
		c.Unknown()
	} else {
		g.keys.count[keyDropped].Inc()
		c.Drop()
	}
}

// replayHeader is the part of an answer's header worth replaying: not the
// framing (hop-by-hop, Content-Length), not Date, and not Set-Cookie (no
// session secrets in the record), at most tokens.MaxReplayHeader bytes.
func replayHeader(h http.Header) map[string][]string {
	out := make(map[string][]string, len(h))
	size := 0
	for name, vs := range h {
		switch name {
		case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
			"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Date", "Set-Cookie":
			continue
		}
		n := len(name)
		for _, v := range vs {
			n += len(v) + 4
		}
		if size+n > tokens.MaxReplayHeader {
			continue
		}
		size += n
		out[name] = vs
	}
	return out
}
