package web

// What the dashboard shows, gathered from a Source: the overview (ranges,
// filters, counts, chart buckets) and a resource's timeline.

import (
	"cmp"
	"context"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// Source is what the dashboard reads. *tokens.Service satisfies it, in
// every storage mode.
type Source interface {
	Rejections(ctx context.Context, q tokens.RejectionQuery) ([]tokens.Rejection, error)
	History(ctx context.Context, resource string, limit int) ([]tokens.Event, error)
	CurrentLeases(ctx context.Context, limit int) ([]tokens.Lease, error)
	Resource(ctx context.Context, name string) (tokens.Resource, error)
	Now() time.Time
}

var _ Source = (*tokens.Service)(nil)

// Bounds of the dashboard's reads.
const (
	// scanMax bounds the rejections one overview aggregates: the newest
	// scanMax in the range. The page says when it was cut.
	scanMax  = 10_000
	pageSize = 1000 // the stores' largest page
	// feedRows is how many rejections the feed shows before live updates.
	feedRows     = 100
	leaseRows    = 100
	topN         = 10
	historyMax   = 1000
	timelineRejs = 2000
)

// Range is one of the overview's selectable time ranges.
type Range struct {
	Key    string        `json:"key"`
	Label  string        `json:"label"`
	Span   time.Duration `json:"-"`
	Bucket time.Duration `json:"-"`
}

var ranges = []Range{
	{Key: "15m", Label: "15 min", Span: 15 * time.Minute, Bucket: 15 * time.Second},
	{Key: "1h", Label: "1 h", Span: time.Hour, Bucket: time.Minute},
	{Key: "24h", Label: "24 h", Span: 24 * time.Hour, Bucket: 30 * time.Minute},
}

func rangeOf(key string) Range {
	for _, r := range ranges {
		if r.Key == key {
			return r
		}
	}
	return ranges[1]
}

// Filter selects rejections; empty fields match everything.
type Filter struct {
	Range    Range
	Resource string
	Holder   string
	Code     string
}

func (f Filter) match(r tokens.Rejection) bool {
	return (f.Holder == "" || r.Holder == f.Holder) && (f.Code == "" || r.Code == f.Code)
}

// Count is a name and how many rejections it had.
type Count struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

// Bucket is one bar of the rejections-over-time chart.
type Bucket struct {
	Start time.Time `json:"start"`
	Count int       `json:"count"`
}

// Overview is everything the overview page shows.
type Overview struct {
	Now       time.Time          `json:"now"`
	Range     string             `json:"range"`
	From      time.Time          `json:"from"`
	Total     int                `json:"total"`     // rejections aggregated (in range, matching)
	Scanned   int                `json:"scanned"`   // rejections read
	Truncated bool               `json:"truncated"` // the scan stopped at scanMax
	Oldest    time.Time          `json:"oldest_scanned,omitzero"`
	Buckets   []Bucket           `json:"buckets"`
	Codes     []Count            `json:"codes"`
	Resources []Count            `json:"top_resources"`
	Holders   []Count            `json:"top_holders"`
	Recent    []tokens.Rejection `json:"-"`
	// ResourceCount is how many resources had rejections aggregated.
	ResourceCount int         `json:"resource_count"`
	Leases        []LeaseView `json:"leases"`
	// LeasesMore: more than len(Leases) leases are held; only the
	// soonest to expire are listed.
	LeasesMore bool `json:"leases_more,omitempty"`
	// Totals of this gateway process since it started (not the store's,
	// not other replicas'); nil without Counts.
	Totals *Totals `json:"totals,omitempty"`
}

// overview aggregates the newest scanMax rejections in f's range.
func overview(ctx context.Context, src Source, counts *Counts, f Filter) (Overview, error) {
	now := src.Now()
	ov := Overview{Now: now, Range: f.Range.Key, From: now.Add(-f.Range.Span)}
	if counts != nil {
		t := counts.Totals()
		ov.Totals = &t
	}
	n := int(f.Range.Span / f.Range.Bucket)
	ov.Buckets = make([]Bucket, n)
	// Align buckets to the bucket size so the bars do not jitter on reload.
	end := now.Truncate(f.Range.Bucket).Add(f.Range.Bucket)
	for i := range ov.Buckets {
		ov.Buckets[i].Start = end.Add(-time.Duration(n-i) * f.Range.Bucket)
	}
	ov.From = ov.Buckets[0].Start
	codes, resources, holders := map[string]int{}, map[string]int{}, map[string]int{}
	q := tokens.RejectionQuery{Resource: f.Resource, Since: ov.From, Limit: pageSize}
	for ov.Scanned < scanMax {
		q.Limit = min(pageSize, scanMax-ov.Scanned)
		page, err := src.Rejections(ctx, q)
		if err != nil {
			return Overview{}, err
		}
		for _, r := range page {
			ov.Scanned++
			ov.Oldest = r.At
			if !f.match(r) {
				continue
			}
			// An entry stands for every refusal it counts (Repeats), each in
			// the bar of the time it happened, as far as the log knows it
			// (spread): only refusals in the range count.
			k := ov.spread(r, f.Range.Bucket)
			if k == 0 {
				continue
			}
			ov.Total += k
			codes[r.Code] += k
			resources[r.Resource] += k
			holders[r.Holder] += k
			ov.Recent = append(ov.Recent, r)
		}
		if len(page) < q.Limit {
			break
		}
		q.Before = page[len(page)-1].ID
		if ov.Scanned >= scanMax {
			// One more look tells whether the range holds more.
			q.Limit = 1
			more, err := src.Rejections(ctx, q)
			if err != nil {
				return Overview{}, err
			}
			ov.Truncated = len(more) > 0
		}
	}
	// The feed lists entries by their latest refusal: a folded entry whose
	// last repeat is new sits on top, however old its first refusal (the
	// log's order, by entry).
	slices.SortStableFunc(ov.Recent, func(a, b tokens.Rejection) int { return cmp.Or(b.At.Compare(a.At), cmp.Compare(b.ID, a.ID)) })
	ov.Recent = ov.Recent[:min(len(ov.Recent), feedRows)]
	ov.ResourceCount = len(resources)
	ov.Codes = top(codes, len(codes))
	ov.Resources = top(resources, topN)
	ov.Holders = top(holders, topN)
	leases, err := src.CurrentLeases(ctx, leaseRows+1)
	if err != nil {
		return Overview{}, err
	}
	if len(leases) > leaseRows {
		leases, ov.LeasesMore = leases[:leaseRows], true
	}
	for _, l := range leases {
		ov.Leases = append(ov.Leases, leaseView(l, now))
	}
	return ov, nil
}

// spread adds r's refusals to the bars they happened in and returns how
// many of them fall in the range. The log keeps a folded entry's first and
// last refusal times (FirstAt, At), not each repeat's: the repeats between
// are spread evenly over that span, the first and the last exactly where
// they were. A refusal stamped by a store clock slightly ahead of the
// gateway's goes in the last bar, so that the chart and the cards agree.
func (ov *Overview) spread(r tokens.Rejection, bucket time.Duration) int {
	k := int(max(r.Repeats, 1))
	first, last := r.FirstAt, r.At
	if k == 1 || first.IsZero() || !first.Before(last) {
		first = last
	}
	span := float64(last.Sub(first))
	// before(x) counts the refusals before x: repeat i of k happened at
	// first + span*i/(k-1).
	before := func(x time.Time) int {
		switch {
		case !x.After(first):
			return 0
		case x.After(last):
			return k
		}
		return min(int(math.Ceil(float64(x.Sub(first))*float64(k-1)/span)), k)
	}
	n := len(ov.Buckets)
	inRange := 0
	for i := range ov.Buckets {
		end := ov.Buckets[i].Start.Add(bucket)
		c := before(end) - before(ov.Buckets[i].Start)
		if i == n-1 {
			c = k - before(ov.Buckets[i].Start)
		}
		ov.Buckets[i].Count += c
		inRange += c
	}
	return inRange
}

func top(m map[string]int, n int) []Count {
	out := make([]Count, 0, len(m))
	for k, v := range m {
		out = append(out, Count{Name: k, Count: v})
	}
	slices.SortFunc(out, func(a, b Count) int { return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Name, b.Name)) })
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// StepKind names a row of a resource's timeline.
type StepKind string

// Timeline step kinds.
const (
	StepGranted        StepKind = "granted"
	StepRenewed        StepKind = "renewed"
	StepReleased       StepKind = "released"
	StepExpired        StepKind = "expired"
	StepRenewRefused   StepKind = "renew_refused"
	StepReleaseRefused StepKind = "release_refused"
	StepRejected       StepKind = "rejected"
	// StepReplayed, StepRetryRefused: a retry with an Idempotency-Key
	// answered from the record of its first write, or refused (its outcome
	// is unknown, or it was another request); Key says which write.
	StepReplayed     StepKind = StepKind(tokens.EventReplayed)
	StepRetryRefused StepKind = StepKind(tokens.EventRetryRefused)
)

// Step is one row of a resource's timeline.
type Step struct {
	At     time.Time `json:"at"`
	Kind   StepKind  `json:"kind"`
	Token  int64     `json:"token"`
	Holder string    `json:"holder"`
	// Granted, renewed: until when.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Granted: writes forwarded under this token (see Timeline.Durable);
	// nil without counts.
	Accepted *uint64 `json:"accepted_writes,omitempty"`
	// Rejected: the refused write(s). Consecutive refusals of the same
	// token, holder, reason and target are one step with Count > 1,
	// from At to Last.
	Count        int       `json:"count,omitempty"`
	Last         time.Time `json:"last,omitzero"`
	Code         string    `json:"code,omitempty"`
	CurrentToken int64     `json:"current_token,omitempty"`
	Method       string    `json:"method,omitempty"`
	Upstream     string    `json:"upstream,omitempty"`
	Path         string    `json:"path,omitempty"`
	LeaseEndedAt time.Time `json:"lease_ended_at,omitzero"`
	// Principal: the API key that presented the lease.
	Principal string `json:"principal,omitempty"`
	// WouldRefuse: an observing upstream forwarded the write; TraceID:
	// the write's trace (of the run's first write).
	WouldRefuse bool   `json:"would_refuse,omitempty"`
	TraceID     string `json:"trace_id,omitempty"`
	// Replayed, retry refused: the key and the write it refers to.
	Key *KeyStep `json:"idempotency,omitempty"`
	// Incident: a refused write or an event that explains one (the end of
	// its lease, the grant that superseded it). Never folded into a run.
	Incident bool `json:"incident,omitempty"`
	// Run: this row stands for a run of routine steps, from At to Last.
	Run *Run `json:"run,omitempty"`
}

// sameRetry reports whether b repeats the retry a: the same key's same
// outcome, from the same holder, token and principal.
func sameRetry(a, b Step) bool {
	return a.Key != nil && b.Key != nil && a.Kind == b.Kind && a.Key.Key == b.Key.Key && a.Key.WriteAt.Equal(b.Key.WriteAt) &&
		a.Key.WriteToken == b.Key.WriteToken && a.Key.Status == b.Key.Status && a.Holder == b.Holder &&
		a.Token == b.Token && a.Upstream == b.Upstream && a.Principal == b.Principal && a.Code == b.Code
}

// KeyStep is what a replayed or refused retry's row says about its key:
// "replayed from the write of 07:03:08".
type KeyStep struct {
	Key string `json:"key"`
	// WriteAt is when the key's first write was forwarded, under
	// WriteToken.
	WriteAt    time.Time `json:"write_at"`
	WriteToken int64     `json:"write_token"`
	// Status is the answer replayed (replayed).
	Status int `json:"status,omitempty"`
}

// Timeline is a resource's story.
type Timeline struct {
	Resource string     `json:"resource"`
	Now      time.Time  `json:"now"`
	Token    int64      `json:"token"`
	Current  *LeaseView `json:"current,omitempty"`
	State    string     `json:"state"`
	// Account sums up the newest refused write (Account.Incidents 0: none).
	Account Account `json:"account"`
	// Steps is one page of rows, newest first; Page of Pages, Rows in all.
	Steps []Step `json:"steps"`
	Page  int    `json:"page"`
	Pages int    `json:"pages"`
	Rows  int    `json:"rows"`
	// Counted: accepted writes are counted. Durable: by every replica,
	// kept in the store; else by this process since CountedSince.
	Counted      bool      `json:"-"`
	Durable      bool      `json:"accepted_writes_durable"`
	CountedSince time.Time `json:"-"`
	// RejectionsFrom: rejections before this time were not read (the
	// newest timelineRejs only); zero if all were.
	RejectionsFrom time.Time `json:"rejections_from,omitzero"`
	HistoryFrom    time.Time `json:"history_from,omitzero"`
}

// timeline builds the story of one resource from its lease history and its
// rejections. Expiries are not events in the history: a lease that was not
// released or renewed past its ExpiresAt, and was followed by a later
// grant (or by nothing, with ExpiresAt in the past), expired at ExpiresAt.
//
// The rows are laid out for people by Timeline.lay: page is 1-based.
func timeline(ctx context.Context, src Source, counts *Counts, name string, page int) (Timeline, error) {
	res, err := src.Resource(ctx, name)
	if err != nil {
		return Timeline{}, err
	}
	now := res.Now
	if now.IsZero() {
		now = src.Now()
	}
	tl := Timeline{Resource: name, Now: now, Token: res.Token, State: "free",
		Counted: counts != nil, Durable: counts.Durable(), CountedSince: counts.Started()}
	if h := res.Holder(now); h != nil {
		v := leaseView(*h, now)
		tl.Current, tl.State = &v, "held"
	} else if res.DrainUntil.After(now) {
		tl.State = "draining"
	}
	events, err := src.History(ctx, name, historyMax)
	if err != nil {
		return Timeline{}, err
	}
	if len(events) == historyMax {
		tl.HistoryFrom = events[len(events)-1].At
	}
	slices.Reverse(events) // oldest first
	// The end of each grant: the last expiry it was given, unless released.
	type grantEnd struct {
		holder    string
		expiresAt time.Time
		released  bool
	}
	ends := map[int64]*grantEnd{}
	var order []int64
	for _, ev := range events {
		step := Step{At: ev.At, Kind: StepKind(ev.Kind), Token: ev.Token, Holder: ev.Holder}
		if k := ev.Key; k != nil {
			step.Upstream, step.Principal, step.Code = k.Upstream, k.Principal, k.Code
			step.Key = &KeyStep{Key: k.Key, WriteAt: k.WriteAt, WriteToken: k.WriteToken, Status: k.Status}
			// A client retrying one key in a loop is one row, like a
			// burst of identical rejections.
			if n := len(tl.Steps); n > 0 && sameRetry(tl.Steps[n-1], step) {
				last := &tl.Steps[n-1]
				last.Count++
				last.Last = step.At
				continue
			}
			step.Count = 1
		}
		switch ev.Kind {
		case tokens.EventGranted:
			step.ExpiresAt = ev.ExpiresAt
			ends[ev.Token] = &grantEnd{holder: ev.Holder, expiresAt: ev.ExpiresAt}
			order = append(order, ev.Token)
		case tokens.EventRenewed:
			step.ExpiresAt = ev.ExpiresAt
			if e := ends[ev.Token]; e != nil {
				e.expiresAt = ev.ExpiresAt
			}
		case tokens.EventReleased, tokens.EventRevoked:
			if e := ends[ev.Token]; e != nil {
				e.released = true
			}
		}
		tl.Steps = append(tl.Steps, step)
	}
	for i, tok := range order {
		e := ends[tok]
		if e.released || e.expiresAt.IsZero() {
			continue
		}
		ended := !now.Before(e.expiresAt) // nothing later, and its time ran out
		if i+1 < len(order) {
			// Superseded: it expired first only if the next grant came after.
			var next time.Time
			for _, s := range tl.Steps {
				if s.Kind == StepGranted && s.Token == order[i+1] {
					next = s.At
					break
				}
			}
			ended = !next.Before(e.expiresAt)
		}
		if ended {
			tl.Steps = append(tl.Steps, Step{At: e.expiresAt, Kind: StepExpired, Token: tok, Holder: e.holder})
		}
	}

	rejs, err := src.Rejections(ctx, tokens.RejectionQuery{Resource: name, Limit: pageSize})
	if err != nil {
		return Timeline{}, err
	}
	for len(rejs) < timelineRejs && len(rejs)%pageSize == 0 && len(rejs) > 0 {
		more, err := src.Rejections(ctx, tokens.RejectionQuery{Resource: name, Before: rejs[len(rejs)-1].ID, Limit: pageSize})
		if err != nil {
			return Timeline{}, err
		}
		rejs = append(rejs, more...)
		if len(more) < pageSize {
			break
		}
	}
	if len(rejs) >= timelineRejs {
		tl.RejectionsFrom = rejs[len(rejs)-1].At
	}
	slices.Reverse(rejs)
	var run *Step
	var runs []Step
	for _, r := range rejs {
		if run != nil && run.Token == r.Token && run.Holder == r.Holder && run.Code == r.Code &&
			run.Method == r.Method && run.Upstream == r.Upstream && run.Path == r.Path && run.CurrentToken == r.CurrentToken &&
			run.Principal == r.Principal && run.WouldRefuse == r.WouldRefuse {
			run.Count += int(max(r.Repeats, 1))
			run.Last = r.At
			continue
		}
		if run != nil {
			runs = append(runs, *run)
		}
		first := r.FirstAt
		if first.IsZero() {
			first = r.At
		}
		run = &Step{At: first, Kind: StepRejected, Token: r.Token, Holder: r.Holder, Count: int(max(r.Repeats, 1)), Code: r.Code,
			CurrentToken: r.CurrentToken, Method: r.Method, Upstream: r.Upstream, Path: r.Path, LeaseEndedAt: r.LeaseEndedAt,
			Principal: r.Principal, WouldRefuse: r.WouldRefuse, TraceID: r.TraceID}
		if run.Count > 1 {
			run.Last = r.At
		}
	}
	if run != nil {
		runs = append(runs, *run)
	}
	tl.Steps = append(tl.Steps, runs...)
	// Time order; at equal times the story order: a grant ends the previous
	// lease's story before a rejection of it is told.
	rank := map[StepKind]int{StepExpired: 0, StepReleased: 1, StepRevoked: 1, StepGranted: 2, StepRenewed: 3, StepRenewRefused: 4, StepReleaseRefused: 5, StepRejected: 6, StepReplayed: 7, StepRetryRefused: 7}
	slices.SortStableFunc(tl.Steps, func(a, b Step) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(rank[a.Kind], rank[b.Kind]))
	})
	tl.lay(tl.Steps, page)
	if counts != nil {
		// Only the grants on this page: one read of the counts.
		var granted []int64
		for _, s := range tl.Steps {
			if s.Kind == StepGranted {
				granted = append(granted, s.Token)
			}
		}
		n, err := counts.Writes(ctx, name, granted)
		if err != nil {
			return Timeline{}, err
		}
		for i := range tl.Steps {
			if tl.Steps[i].Kind == StepGranted {
				v := n[tl.Steps[i].Token]
				tl.Steps[i].Accepted = &v
			}
		}
	}
	return tl, nil
}

// LeaseView is a lease as the dashboard shows it: never its id, which is
// the holder's secret.
type LeaseView struct {
	Resource  string        `json:"resource"`
	Holder    string        `json:"holder"`
	Token     int64         `json:"token"`
	GrantedAt time.Time     `json:"granted_at"`
	ExpiresAt time.Time     `json:"expires_at"`
	Remaining time.Duration `json:"-"`
	TTLms     int64         `json:"ttl_ms"`
	// ClockOffset is the holder's clock minus the gateway's, if it sent
	// Fencing-Client-Time lately; ClockOff: by a second or more.
	ClockOffset *time.Duration `json:"clock_offset_ns,omitempty"`
	ClockOff    bool           `json:"-"`
}

func leaseView(l tokens.Lease, now time.Time) LeaseView {
	rem := l.Remaining(now)
	return LeaseView{Resource: l.Resource, Holder: l.Holder, Token: l.Token, GrantedAt: l.GrantedAt, ExpiresAt: l.ExpiresAt, Remaining: rem, TTLms: rem.Milliseconds()}
}
