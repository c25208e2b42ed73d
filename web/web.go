// Package web is fencegw's dashboard: server-rendered pages and their static
// assets, embedded in the binary. No Node toolchain, no CDN: html/template
// pages that work without JavaScript, inline SVG charts drawn on the server,
// and one small hand-written script (static/app.js) for the live feed and
// the lease countdowns.
//
// Routes, all under /ui/ (the gateway mounts the handler there):
//
//	GET /ui/                          overview and live feed (?range=15m|1h|24h&resource=&holder=&code=)
//	GET /ui/resources/{resource}      a resource's timeline (the name percent-encoded)
//	GET /ui/api/overview              the overview's aggregates as JSON (same query)
//	GET /ui/api/resources/{resource}  the timeline as JSON
//	GET /ui/static/{file}             CSS and JS
//
// Lease ids (the holders' secrets) and request bodies are never shown: the
// pages see leases only as LeaseView and rejections only as recorded.
package web

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

//go:embed templates static
var assets embed.FS

var pages = template.Must(template.New("").Funcs(funcs).ParseFS(assets, "templates/*.html"))

// csp allows only the dashboard's own files: no inline script, no inline
// style, nothing from elsewhere.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Handler serves the dashboard under /ui/ from src; counts (may be nil)
// supplies accepted-write counts and totals since start.
func Handler(src Source, counts *Counts, opts ...Option) http.Handler {
	h := &handler{src: validUTF8{src}, counts: counts, log: slog.Default()} // utf8.go
	for _, o := range opts {
		o(h)
	}
	static, _ := fs.Sub(assets, "static")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ui/{$}", h.overview)
	mux.HandleFunc("GET /ui/resources/{name...}", h.resource)
	mux.HandleFunc("GET /ui/api/overview", h.overviewJSON)
	mux.HandleFunc("GET /ui/api/resources/{name...}", h.resourceJSON)
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", cacheFor(http.FileServerFS(static))))
	return secure(mux)
}

// Option configures Handler.
type Option func(*handler)

// WithClocks shows each holder's clock offset (as the gateway estimated it
// from Fencing-Client-Time) next to the holder in the leases table.
func WithClocks(c *tokens.Clocks) Option { return func(h *handler) { h.clocks = c } }

type handler struct {
	src    Source
	counts *Counts
	clocks *tokens.Clocks
	log    *slog.Logger
}

func secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("X-Frame-Options", "DENY")
		next.ServeHTTP(w, r)
	})
}

func cacheFor(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		next.ServeHTTP(w, r)
	})
}

// reasons are the rejection codes a filter may name.
var reasons = tokens.RejectionCodes

// filterOf reads the filters of a view. A value that cannot match anything
// (an unknown range or reason, a resource name or holder the gateway would
// never accept) is an error, so that a typo is not shown as "no rejections".
func filterOf(r *http.Request) (Filter, error) {
	q := r.URL.Query()
	f := Filter{Range: rangeOf(q.Get("range")), Resource: q.Get("resource"), Holder: q.Get("holder"), Code: q.Get("code")}
	if key := q.Get("range"); key != "" && f.Range.Key != key {
		keys := make([]string, len(ranges))
		for i, r := range ranges {
			keys[i] = r.Key
		}
		return f, tokens.Invalid("range", "must be one of "+strings.Join(keys, ", "))
	}
	if f.Code != "" && !slices.Contains(reasons, f.Code) {
		return f, tokens.Invalid("code", "must be one of "+strings.Join(reasons, ", "))
	}
	if f.Resource != "" {
		if err := tokens.DefaultLimits.ValidateResource(f.Resource); err != nil {
			return f, err
		}
	}
	if err := tokens.DefaultLimits.ValidateHolder(f.Holder); err != nil {
		return f, err
	}
	return f, nil
}

type overviewPage struct {
	Title   string
	Filter  Filter
	Ranges  []Range
	Reasons []string
	Counted bool
	Clocked bool
	Chart   chart
	Overview
	StreamURL string
	AfterID   int64
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	f, err := filterOf(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// The feed goes live after the newest rejection recorded before the
	// page's own read of the store, so that nothing falls between the two:
	// the stream replays anything after it (rows the page already shows are
	// skipped by app.js), and the aggregates include everything up to it.
	newest, err := h.src.Rejections(r.Context(), tokens.RejectionQuery{Limit: 1})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ov, err := overview(r.Context(), h.src, h.counts, f)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.clockOf(ov.Leases, ov.Now)
	p := overviewPage{Title: "Rejected stale writes", Filter: f, Ranges: ranges, Overview: ov, Counted: h.counts != nil, Clocked: h.clocks != nil,
		Reasons: reasons,
		Chart:   drawChart(ov, f.Range)}
	if len(newest) > 0 {
		p.AfterID = newest[0].ID
	}
	p.StreamURL = streamURL(f)
	h.render(w, r, "overview.html", p)
}

func (h *handler) overviewJSON(w http.ResponseWriter, r *http.Request) {
	f, err := filterOf(r)
	if err != nil {
		h.failJSON(w, r, err)
		return
	}
	ov, err := overview(r.Context(), h.src, h.counts, f)
	if err != nil {
		h.failJSON(w, r, err)
		return
	}
	h.clockOf(ov.Leases, ov.Now)
	writeJSON(w, ov)
}

// pageOf reads ?page=N (1-based; absent: the first page; a page past the
// last shows the last).
func pageOf(r *http.Request) (int, error) {
	v := r.URL.Query().Get("page")
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, tokens.Invalid("page", "must be a whole number from 1")
	}
	return n, nil
}

type resourcePage struct {
	Title string
	Timeline
}

func (h *handler) resource(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("name") == "" && r.URL.Query().Get("name") != "" {
		// The "open a resource" form, without JavaScript.
		http.Redirect(w, r, "/ui/resources/"+url.PathEscape(strings.TrimSpace(r.URL.Query().Get("name"))), http.StatusSeeOther)
		return
	}
	page, err := pageOf(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	tl, err := timeline(r.Context(), h.src, h.counts, r.PathValue("name"), page)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, r, "resource.html", resourcePage{Title: tl.Resource, Timeline: tl})
}

func (h *handler) resourceJSON(w http.ResponseWriter, r *http.Request) {
	page, err := pageOf(r)
	if err != nil {
		h.failJSON(w, r, err)
		return
	}
	tl, err := timeline(r.Context(), h.src, h.counts, r.PathValue("name"), page)
	if err != nil {
		h.failJSON(w, r, err)
		return
	}
	writeJSON(w, tl)
}

func (h *handler) render(w http.ResponseWriter, r *http.Request, name string, data any) {
	var buf bytes.Buffer
	if err := pages.ExecuteTemplate(&buf, name, data); err != nil {
		h.log.Error("render dashboard page", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(buf.Bytes())
}

type errorPage struct {
	Title   string
	Status  int
	Message string
}

// problemOf is how the dashboard answers err: the status, code, title and
// Retry-After of the one table of problems (internal/problems), and what
// it tells a person about it.
func problemOf(err error) (p problems.Problem, msg string) {
	p, known := problems.Of(err)
	switch {
	case !known:
		msg = "Internal error."
	case errors.Is(err, tokens.ErrNotFound):
		msg = "No such resource: it was never granted."
	case errors.Is(err, tokens.ErrStoreUnavailable):
		msg = "The store is unavailable; try again in a moment."
	default:
		msg = err.Error()
	}
	return p, msg
}

func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	p, msg := problemOf(err)
	if p.Status >= 500 {
		h.log.Error("dashboard", "path", tokens.RedactLeaseIDs(r.URL.Path), "err", err)
	}
	var buf bytes.Buffer
	if err := pages.ExecuteTemplate(&buf, "error.html", errorPage{Title: p.Title, Status: p.Status, Message: msg}); err != nil {
		http.Error(w, msg, p.Status)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", problems.RetryAfterSeconds(p.RetryAfter))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(buf.Bytes())
}

func (h *handler) failJSON(w http.ResponseWriter, r *http.Request, err error) {
	p, msg := problemOf(err)
	if p.Status >= 500 {
		h.log.Error("dashboard api", "path", tokens.RedactLeaseIDs(r.URL.Path), "err", err)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", problems.RetryAfterSeconds(p.RetryAfter))
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "urn:fencegw:problem:" + p.Code, "title": p.Title,
		"status": p.Status, "code": p.Code, "detail": msg})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

func streamURL(f Filter) string {
	var parts []string
	for _, kv := range [][2]string{{"resource", f.Resource}, {"holder", f.Holder}, {"code", f.Code}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+"="+queryEscape(kv[1]))
		}
	}
	u := "/v1/rejections/stream"
	if len(parts) > 0 {
		u += "?" + strings.Join(parts, "&")
	}
	return u
}

// clockSkewShown is the clock offset from which the leases table marks a
// holder's clock as off.
const clockSkewShown = time.Second

// clockOf fills in the holders' clock offsets, where known.
func (h *handler) clockOf(leases []LeaseView, now time.Time) {
	for i := range leases {
		if o, ok := h.clocks.Offset(leases[i].Holder, now); ok {
			leases[i].ClockOffset = &o.Offset
			leases[i].ClockOff = o.Offset >= clockSkewShown || o.Offset <= -clockSkewShown
		}
	}
}
