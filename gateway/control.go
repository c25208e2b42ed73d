package gateway

// The control API: the generated strict server's handlers over a
// tokens.Service (leases, resources, rejections), their JSON, and the
// handling of malformed control requests and bodies.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fencegw/fencegw/api"
	"github.com/fencegw/fencegw/api/server"
	"github.com/fencegw/fencegw/gateway/internal/framing"
	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// control implements the generated strict server over a tokens.Service.
// Handlers return domain errors; one error handler turns them into problems.
type control struct {
	svc     *tokens.Service
	metrics *metrics
	clocks  *tokens.Clocks
	tracing bool // spans are named and given attributes (tracing.go)
}

var _ server.StrictServerInterface = (*control)(nil)

// quietAcquire is how long an acquire without wait_ms runs before it
// watches its client: longer than a grant takes when nothing holds it up
// (a group commit: 4 ms at the load tool's p50, 15 ms at its p99).
const quietAcquire = 50 * time.Millisecond

func (c *control) AcquireLease(ctx context.Context, req server.AcquireLeaseRequestObject) (server.AcquireLeaseResponseObject, error) {
	if req.Body == nil {
		return nil, tokens.Invalid("body", "a JSON object is required")
	}
	arrived := c.svc.Now()
	b := req.Body
	in := tokens.AcquireRequest{Resource: b.Resource, TTL: millis(b.TtlMs)}
	if b.Holder != nil {
		in.Holder = *b.Holder
	}
	if err := c.observeClock(req.Params.FencingClientTime, in.Holder, arrived); err != nil {
		return nil, err
	}
	if b.WaitMs != nil {
		in.Wait = millis(*b.WaitMs)
	}
	if p := principalFrom(ctx); p != nil {
		in.Owner = p.Name
		if err := c.checkAcquire(ctx, p, &in); err != nil {
			return nil, err
		}
	}
	c.nameSpan(ctx, "acquire", spanFacts{resource: in.Resource, hasResource: true})
	// An acquire stops when its client goes: no lease for a client that
	// is not there to take it (Go's server tells its requests by itself;
	// the listener's own loop, on request). One that need not wait for the
	// resource is usually over within a group commit: it is watched only
	// once it has taken quietAcquire (waiting for a write of the previous
	// token in flight, or for a drain's end).
	var stop func()
	if in.Wait > 0 {
		ctx, stop = framing.WatchClient(ctx)
	} else {
		ctx, stop = framing.WatchClientAfter(ctx, quietAcquire)
	}
	defer stop()
	// The watch may hear the client go only after the grant took the lock
	// it waited for (both at once, after a pause): the grant asks first.
	// An acquire over sooner than quietAcquire is not asked, as it is not
	// watched: the question is a system call.
	start, waits := time.Now(), in.Wait > 0
	in.ClientGone = func() error {
		if !waits && time.Since(start) < quietAcquire {
			return nil
		}
		return framing.ClientGone(ctx)
	}
	lease, err := c.svc.Acquire(ctx, in)
	// Abandoned: its client went (the loop's watch, or Go's server's
	// cancellation), whatever the store call it cut short answered
	// (writeProblem, and the metric's "abandoned", not "store_unavailable").
	if err != nil && !errors.Is(err, framing.ErrClientGone) &&
		(errors.Is(context.Cause(ctx), framing.ErrClientGone) || errors.Is(ctx.Err(), context.Canceled)) {
		err = fmt.Errorf("%w: %w", framing.ErrClientGone, err)
	}
	c.metrics.grant(err)
	c.endSpan(ctx, err)
	if err != nil {
		return nil, err
	}
	c.nameSpan(ctx, "acquire", spanFacts{token: lease.Token, hasToken: true})
	return server.AcquireLease201JSONResponse(leaseJSON(lease, tokens.StateCurrent, lease.TTL)), nil
}

// checkAcquire applies the key's resource prefixes and gives the request
// its caps, which the Service and the store enforce.
func (c *control) checkAcquire(ctx context.Context, p *Principal, in *tokens.AcquireRequest) error {
	if err := mayUse(ctx, in.Resource); err != nil {
		return err
	}
	in.MaxTTL, in.MaxLeases = p.MaxTTL, p.MaxLeases
	return nil
}

func (c *control) GetLease(ctx context.Context, req server.GetLeaseRequestObject) (server.GetLeaseResponseObject, error) {
	lease, err := c.svc.Lease(ctx, req.LeaseId)
	if err != nil {
		return nil, err
	}
	if err := mayUse(ctx, lease.Resource); err != nil {
		return nil, err
	}
	res, err := c.svc.Resource(ctx, lease.Resource)
	if err != nil {
		return nil, err
	}
	now := c.svc.Clock(res)
	state := res.StateOf(lease, now)
	if res.Lease != nil && res.Lease.ID == lease.ID {
		lease = *res.Lease
	}
	remaining := time.Duration(0)
	if state == tokens.StateCurrent {
		remaining = lease.Remaining(now)
	}
	return server.GetLease200JSONResponse(leaseJSON(lease, state, remaining)), nil
}

func (c *control) RenewLease(ctx context.Context, req server.RenewLeaseRequestObject) (server.RenewLeaseResponseObject, error) {
	arrived := c.svc.Now()
	var clientSent time.Time
	var rtt time.Duration
	if v := req.Params.FencingClientTime; v != nil {
		var err error
		if clientSent, rtt, err = parseClientTime(*v); err != nil {
			return nil, err
		}
	}
	var ttl time.Duration // 0: the lease's own TTL
	if req.Body != nil && req.Body.TtlMs != nil {
		if ttl = millis(*req.Body.TtlMs); ttl == 0 {
			ttl = -1 // an explicit 0 is out of range, not "default"
		}
	}
	renew := tokens.RenewRequest{LeaseID: req.LeaseId, TTL: ttl}
	if p := principalFrom(ctx); p != nil {
		renew.Principal, renew.MaxTTL = p.Name, p.MaxTTL
	}
	c.nameSpan(ctx, "renew", spanFacts{})
	lease, err := c.svc.Renew(ctx, renew)
	c.endSpan(ctx, err)
	if f := tokens.ErrorOf(err); f != nil {
		c.nameSpan(ctx, "renew", leaseFacts(f.Resource, f.Token))
	} else if err == nil {
		c.nameSpan(ctx, "renew", leaseFacts(lease.Resource, lease.Token))
	}
	if err != nil {
		c.metrics.leaseRefused("renew", req.LeaseId, err, c.svc.Now())
		if f := tokens.ErrorOf(err); f != nil && f.Holder != "" && !clientSent.IsZero() {
			c.clocks.Observe(f.Holder, clientSent, rtt, arrived) // the holder the refusal is about
		}
		return nil, err
	}
	if !clientSent.IsZero() {
		c.clocks.Observe(lease.Holder, clientSent, rtt, arrived)
	}
	return server.RenewLease200JSONResponse(leaseJSON(lease, tokens.StateCurrent, lease.TTL)), nil
}

func (c *control) ReleaseLease(ctx context.Context, req server.ReleaseLeaseRequestObject) (server.ReleaseLeaseResponseObject, error) {
	c.nameSpan(ctx, "release", spanFacts{})
	lease, err := c.svc.Release(ctx, req.LeaseId, principalName(ctx))
	c.endSpan(ctx, err)
	if f := tokens.ErrorOf(err); f != nil {
		c.nameSpan(ctx, "release", leaseFacts(f.Resource, f.Token))
	} else if err == nil {
		c.nameSpan(ctx, "release", leaseFacts(lease.Resource, lease.Token))
	}
	if err != nil {
		c.metrics.leaseRefused("release", req.LeaseId, err, c.svc.Now())
		return nil, err
	}
	return server.ReleaseLease204Response{}, nil
}

// anonymousAdmin names the revoker in the lease history when the gateway
// runs without authentication.
const anonymousAdmin = "(no authentication)"

func (c *control) RevokeLease(ctx context.Context, req server.RevokeLeaseRequestObject) (server.RevokeLeaseResponseObject, error) {
	by := anonymousAdmin
	if p := principalFrom(ctx); p != nil {
		if p.Role < RoleAdmin {
			return nil, &tokens.Error{Kind: problems.ErrForbidden, Detail: "revoking needs the admin role"}
		}
		lease, err := c.svc.Lease(ctx, req.LeaseId)
		if err != nil {
			return nil, err
		}
		if err := mayUse(ctx, lease.Resource); err != nil {
			return nil, err
		}
		by = p.Name
	}
	lease, err := c.svc.Revoke(ctx, req.LeaseId, by)
	if err != nil {
		return nil, err
	}
	return server.RevokeLease200JSONResponse(leaseJSON(lease, tokens.StateReleased, 0)), nil
}

func (c *control) GetResource(ctx context.Context, req server.GetResourceRequestObject) (server.GetResourceResponseObject, error) {
	if err := mayUse(ctx, req.Resource); err != nil {
		return nil, err
	}
	res, err := c.svc.Resource(ctx, req.Resource)
	if err != nil {
		return nil, err
	}
	now := c.svc.Clock(res)
	out := api.ResourceState{Resource: res.Name, Token: res.Token}
	if res.Name == "" {
		out.Resource = req.Resource
	}
	if l := res.Lease; l != nil {
		holder, exp := l.Holder, l.ExpiresAt.UTC()
		out.Holder, out.ExpiresAt = &holder, &exp
	}
	if h := res.Holder(now); h != nil {
		out.Held = true
		out.TtlMs = h.Remaining(now).Milliseconds()
	}
	if res.DrainUntil.After(now) {
		d := res.DrainUntil.UTC()
		out.DrainUntil = &d
	}
	return server.GetResource200JSONResponse(out), nil
}

const (
	defaultRejectionPage = 100
	maxRejectionPage     = 1000
)

func (c *control) ListRejections(ctx context.Context, req server.ListRejectionsRequestObject) (server.ListRejectionsResponseObject, error) {
	p := req.Params
	q := tokens.RejectionQuery{Limit: defaultRejectionPage}
	if p.Limit != nil {
		if *p.Limit < 1 || *p.Limit > maxRejectionPage {
			return nil, tokens.Invalid("limit", "must be between 1 and 1000")
		}
		q.Limit = *p.Limit
	}
	if p.Resource != nil {
		if err := c.svc.Limits().ValidateResource(*p.Resource); err != nil {
			return nil, err
		}
		q.Resource = *p.Resource
	}
	if p.Since != nil {
		q.Since = *p.Since
	}
	if p.Cursor != nil {
		before, err := strconv.ParseInt(*p.Cursor, 10, 64)
		if err != nil || before <= 0 {
			return nil, tokens.Invalid("cursor", "not a cursor returned by this endpoint")
		}
		q.Before = before
	}
	// One extra row tells whether another page exists.
	want := q.Limit
	q.Limit++
	items, err := c.svc.Rejections(ctx, q)
	if err != nil {
		return nil, err
	}
	out := api.RejectionList{Items: make([]api.Rejection, 0, min(len(items), want))}
	for i, r := range items {
		if i == want {
			cursor := strconv.FormatInt(items[want-1].ID, 10)
			out.NextCursor = &cursor
			break
		}
		out.Items = append(out.Items, rejectionJSON(r))
	}
	return server.ListRejections200JSONResponse(out), nil
}

// millis converts client milliseconds to a Duration without overflow:
// values beyond any limit map to an out-of-range duration the Service
// refuses with a message naming the field.
func millis(ms int64) time.Duration {
	const maxMs = int64(365 * 24 * time.Hour / time.Millisecond)
	switch {
	case ms < 0:
		return -1
	case ms > maxMs:
		return time.Duration(maxMs) * time.Millisecond
	}
	return time.Duration(ms) * time.Millisecond
}

func leaseJSON(l tokens.Lease, state tokens.LeaseState, remaining time.Duration) api.Lease {
	out := api.Lease{
		LeaseId:   l.ID,
		Resource:  l.Resource,
		Holder:    l.Holder,
		Token:     l.Token,
		TtlMs:     remaining.Milliseconds(),
		GrantedAt: l.GrantedAt.UTC(),
		ExpiresAt: l.ExpiresAt.UTC(),
		State:     api.LeaseState(state),
	}
	if l.Released() {
		t := l.ReleasedAt.UTC()
		out.ReleasedAt = &t
	}
	return out
}

func rejectionJSON(r tokens.Rejection) api.Rejection {
	out := api.Rejection{
		Id:           r.ID,
		At:           r.At.UTC(),
		Resource:     r.Resource,
		Code:         api.RejectionCode(r.Code),
		Token:        r.Token,
		CurrentToken: r.CurrentToken,
		Holder:       r.Holder,
		Method:       r.Method,
		Upstream:     r.Upstream,
		Path:         r.Path,
		Repeats:      max(r.Repeats, 1),
		FirstAt:      r.FirstAt.UTC(),
	}
	if out.FirstAt.IsZero() {
		out.FirstAt = out.At
	}
	if r.LeaseHint != "" {
		hint := r.LeaseHint
		out.LeaseHint = &hint
	}
	if r.Principal != "" {
		principal := r.Principal
		out.Principal = &principal
	}
	if !r.LeaseEndedAt.IsZero() {
		t := r.LeaseEndedAt.UTC()
		out.LeaseEndedAt = &t
	}
	if r.WouldRefuse {
		yes := true
		out.WouldRefuse = &yes
	}
	if r.TraceID != "" {
		id := r.TraceID
		out.TraceId = &id
	}
	return out
}

// requestErrorHandler answers bodies the generated code could not decode.
func (g *Gateway) requestErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	var maxBytes *http.MaxBytesError
	if errors.As(err, &maxBytes) || errors.Is(err, problems.ErrRequestTimeout) {
		writeProblem(w, r, g.log, err)
		return
	}
	field, detail := "body", "must be a JSON object"
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		if typeErr.Field != "" {
			field = typeErr.Field
		}
		detail = "must be " + jsonTypeName(typeErr.Type.Kind().String())
	case errors.As(err, &syntaxErr):
		detail = "is not valid JSON (at byte " + strconv.FormatInt(syntaxErr.Offset, 10) + ")"
	case strings.Contains(err.Error(), "EOF"):
		detail = "is empty or truncated"
	}
	writeProblem(w, r, g.log, tokens.Invalid(field, detail))
}

func jsonTypeName(kind string) string {
	switch kind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	}
	return "an object of the documented shape"
}

// paramErrorHandler answers path and query parameters that do not parse.
func (g *Gateway) paramErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	// The generated binder runs before controlBody and refuses a declared
	// parameter given twice as malformed: the query's own check names it
	// better ("is given twice"), and an unknown one beside it.
	if qerr := checkQuery(r, ""); qerr != nil {
		writeProblem(w, r, g.log, qerr)
		return
	}
	field := "parameters"
	var f *server.InvalidParamFormatError
	if errors.As(err, &f) {
		field = f.ParamName
	}
	detail := "is malformed"
	if field == "since" {
		detail = "must be an RFC 3339 time"
	}
	writeProblem(w, r, g.log, tokens.Invalid(field, detail))
}

// controlBody bounds control-call bodies and insists they are JSON: a body
// needs Content-Type: application/json (or +json), which a cross-site page
// cannot send without a CORS preflight the gateway never grants (hosts.go),
// and must be one JSON value with nothing after it. It also refuses a
// query parameter the call does not take (checkQuery).
func (g *Gateway) controlBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := checkQuery(r, ""); err != nil { // strictquery.go
			writeProblem(w, r, g.log, err)
			return
		}
		if r.Method == http.MethodPost {
			hasBody := r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
			if ct := r.Header.Get("Content-Type"); ct != "" || hasBody {
				if !jsonMediaType(ct) {
					detail := "control calls take application/json"
					if ct == "" {
						detail = "a control call with a body needs Content-Type: application/json"
					}
					p := problemOf(problems.ErrUnsupportedMediaType)
					p.Field, p.Detail = "Content-Type", detail
					sendProblem(w, r, p)
					return
				}
			}
			if r.ContentLength > g.cfg.MaxControlBody {
				writeProblem(w, r, g.log, &http.MaxBytesError{Limit: g.cfg.MaxControlBody})
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, g.cfg.MaxControlBody)
			_, lift := limitBody(w, r, g.cfg.BodyTimeout)
			defer lift()
			if hasBody {
				data, err := readWhole(r.Body, r.ContentLength) // at most MaxControlBody: refused above
				if err != nil {
					var maxBytes *http.MaxBytesError
					if !errors.As(err, &maxBytes) && !errors.Is(err, problems.ErrRequestTimeout) {
						err = tokens.Invalid("body", "could not be read: "+err.Error())
					}
					writeProblem(w, r, g.log, err)
					return
				}
				if err := oneJSONValue(data); err != nil {
					writeProblem(w, r, g.log, err)
					return
				}
				if err := checkFields(data, fieldsFor(r)); err != nil { // strictjson.go
					writeProblem(w, r, g.log, err)
					return
				}
				rb := &readBody{data: data}
				rb.Reset(data)
				r.Body = rb
			}
		}
		next.ServeHTTP(w, r)
	})
}

// jsonMediaType reports whether the Content-Type ct names JSON
// (application/json, or a +json type), as mime.ParseMediaType reads it.
// The value every client sends is told without it: ParseMediaType builds
// a map of parameters for each call.
func jsonMediaType(ct string) bool {
	if ct == "application/json" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// readWhole reads body to its end, as io.ReadAll does, into a buffer sized
// for the announced length (io.ReadAll starts at 512 bytes for the ~80 of
// an acquire); the size limit is body's own (http.MaxBytesReader), and the
// caller bounds length.
func readWhole(body io.Reader, length int64) ([]byte, error) {
	if length <= 0 {
		return io.ReadAll(body)
	}
	b := make([]byte, 0, length+1) // +1: EOF is seen without growing
	for {
		n, err := body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // longer than announced: let append grow it
		}
	}
}

// oneJSONValue refuses data that holds something after its first JSON
// value (a second object, garbage). A value that does not parse is left to
// the generated decoder, whose errors name the field.
func oneJSONValue(data []byte) error {
	if json.Valid(data) {
		// One value, whitespace at most around it: the common case, checked
		// without the decoder's allocations (a decoder and its buffer were
		// ~1 KiB per grant, a tenth of the grant path's allocations).
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var v json.RawMessage
	if dec.Decode(&v) != nil {
		return nil
	}
	end := dec.InputOffset()
	if _, err := dec.Token(); err != io.EOF {
		return tokens.Invalid("body", "must be one JSON value; there is more after byte "+strconv.FormatInt(end, 10))
	}
	return nil
}
