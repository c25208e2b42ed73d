package torture

// The checker: the rules a torture run's history must keep (tokens never go
// down at the upstream, no write of a superseded token lands after the next
// grant, no refused write reaches the upstream, ...) and the Violations it
// reports.

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Rules the checker applies; a Violation names one.
const (
	// RuleTokenOrder: per resource, tokens never go down in arrival order.
	RuleTokenOrder = "token-order"
	// RuleStaleApplied: no write applied whose token was below a grant of
	// its resource that had already returned (for a write whose outcome was
	// unknown: returned within a drain period of its sending).
	RuleStaleApplied = "stale-applied"
	// RuleExactlyOnce: every 2xx write applied exactly once, and no write
	// applied twice.
	RuleExactlyOnce = "exactly-once"
	// RuleRejectedApplied: no refused write (4xx, 503) reached the upstream.
	RuleRejectedApplied = "rejected-applied"
	// RuleDuplicateToken: no token granted twice for a resource.
	RuleDuplicateToken = "duplicate-token"
	// RuleStoreDown: nothing forwarded while the token or lease store was down.
	RuleStoreDown = "store-down"
	// RuleTokenMismatch: the upstream got the token of the lease the write
	// was sent under, not another one.
	RuleTokenMismatch = "token-mismatch"
	// RuleForeignLease: nothing is done under a lease by a principal that
	// did not acquire it: no write sent with another key's lease id reached
	// the upstream, and no such renewal or release succeeded.
	RuleForeignLease = "foreign-lease"
	// RuleForeignRoute: no write sent to one resource's path under a
	// lease of another resource (a route theft) reached the upstream: the
	// gateway's route bindings refuse it.
	RuleForeignRoute = "foreign-route"
	// RuleKeyOnce: a write sent with an Idempotency-Key, however often it
	// was retried, reached the upstream at most once.
	RuleKeyOnce = "idempotency-key-once"
)

// Rules lists every rule, in report order.
var Rules = []string{RuleTokenOrder, RuleStaleApplied, RuleExactlyOnce, RuleRejectedApplied, RuleDuplicateToken, RuleStoreDown, RuleTokenMismatch, RuleForeignLease, RuleForeignRoute, RuleKeyOnce}

// maxExamples bounds the violations kept per rule; all are counted.
const maxExamples = 10

// Violation is one broken guarantee.
type Violation struct {
	Rule   string `json:"rule"`
	Detail string `json:"detail"`
}

// Stats are the figures of a run.
type Stats struct {
	Grants         int `json:"grants"`
	Writes         int `json:"writes"`
	OK             int `json:"ok"`              // 2xx
	StaleRejected  int `json:"stale_rejected"`  // 409 stale_token, lease_expired, lease_released
	StaleAttempts  int `json:"stale_attempts"`  // refused as stale, or sent after the worker's TTL ran out
	Unavailable    int `json:"unavailable"`     // 503
	UnknownOutcome int `json:"unknown_outcome"` // 408, 413, 502, 504, no answer
	OtherRefused   int `json:"other_refused"`   // other 4xx
	Arrivals       int `json:"arrivals"`        // at the upstream
	Applied        int `json:"applied"`         // acted on by the upstream
	ForeignWrites  int `json:"foreign_writes"`  // thieves' writes: sent with another principal's lease
	ForeignOps     int `json:"foreign_ops"`     // thieves' renewals and releases
	ForeignRefused int `json:"foreign_refused"` // of those, 403 lease_not_owned
	RouteThefts    int `json:"route_thefts"`    // writes under a lease of one resource to another's path
	RouteRefused   int `json:"route_refused"`   // of those, 403 resource_mismatch
	KeyRetries     int `json:"key_retries"`     // keyed writes sent again with their key
	KeyReplayed    int `json:"key_replayed"`    // retries answered from the gateway's record
	KeyUnknown     int `json:"key_unknown"`     // retries answered idempotency_outcome_unknown
	// HeldInOutage: writes that arrived during a Redis outage under a
	// lease granted before it (admitted from a fence already held).
	HeldInOutage    int            `json:"held_in_outage,omitempty"`
	Faults          map[string]int `json:"faults"`           // by kind
	ViolationCounts map[string]int `json:"violation_counts"` // by rule
}

// Report is the checker's verdict.
type Report struct {
	Stats      Stats       `json:"stats"`
	Violations []Violation `json:"violations"` // up to maxExamples per rule
	// Void, if set, says why the run proves nothing: no fault, no stale
	// write attempted, no write accepted, no answer to a write sent with
	// another principal's lease, or none to a write sent to another
	// resource's path.
	Void string `json:"void,omitempty"`
}

// ViolationCount is the number of violations found, examples or not.
func (r Report) ViolationCount() int {
	n := 0
	for _, c := range r.Stats.ViolationCounts {
		n += c
	}
	return n
}

// OK reports whether the run passed: no violation and not void.
func (r Report) OK() bool { return r.ViolationCount() == 0 && r.Void == "" }

// String is a human summary.
func (r Report) String() string {
	var b strings.Builder
	s := r.Stats
	fmt.Fprintf(&b, "grants %d, writes %d: %d ok, %d stale rejected (%d stale attempts), %d unavailable, %d unknown outcome, %d other refused\n",
		s.Grants, s.Writes, s.OK, s.StaleRejected, s.StaleAttempts, s.Unavailable, s.UnknownOutcome, s.OtherRefused)
	fmt.Fprintf(&b, "upstream: %d arrivals, %d applied\n", s.Arrivals, s.Applied)
	fmt.Fprintf(&b, "keyed retries: %d (%d replayed, %d outcome unknown)\n", s.KeyRetries, s.KeyReplayed, s.KeyUnknown)
	fmt.Fprintf(&b, "thieves: %d writes, %d renewals/releases with another principal's lease; %d refused lease_not_owned\n",
		s.ForeignWrites, s.ForeignOps, s.ForeignRefused)
	fmt.Fprintf(&b, "route thieves: %d writes to another resource's path; %d refused resource_mismatch\n", s.RouteThefts, s.RouteRefused)
	kinds := make([]string, 0, len(s.Faults))
	for k := range s.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	b.WriteString("faults:")
	for _, k := range kinds {
		fmt.Fprintf(&b, " %s=%d", k, s.Faults[k])
	}
	if s.Faults[FaultRestartRedis] > 0 {
		fmt.Fprintf(&b, "; %d writes arrived in a Redis outage under leases granted before it", s.HeldInOutage)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "violations: %d", r.ViolationCount())
	for _, rule := range Rules {
		if n := s.ViolationCounts[rule]; n > 0 {
			fmt.Fprintf(&b, " %s=%d", rule, n)
		}
	}
	b.WriteString("\n")
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  %s: %s\n", v.Rule, v.Detail)
	}
	switch {
	case r.Void != "":
		fmt.Fprintf(&b, "VOID: %s\n", r.Void)
	case r.OK():
		b.WriteString("PASS\n")
	default:
		b.WriteString("FAIL\n")
	}
	return b.String()
}

// staleCodes are the refusals of a write whose lease is no longer current.
var staleCodes = map[string]bool{"stale_token": true, "lease_expired": true, "lease_released": true}

// codeNotOwned is the refusal of a write, renewal or release with another
// principal's lease (tokens.CodeLeaseNotOwned).
const codeNotOwned = "lease_not_owned"

// codeWrongResource is the refusal of a write to a path whose route binds
// another resource than the lease's (tokens.CodeResourceMismatch).
const codeWrongResource = "resource_mismatch"

// unknownOutcome: the write may or may not have landed. 408 and 413 are
// the gateway cutting a body it had started to forward (too slow, too
// large): the upstream may have seen part of it, and the gateway drains the
// resource as for a timeout.
func unknownOutcome(status int) bool {
	return status == 0 || status == 408 || status == 413 || status == 502 || status == 504
}

// sentAs is the attempt an arrival came from: the first attempt of its
// write that carried its token, else its first attempt.
func sentAs(writes map[string]*Write, attempts map[string][]*Write, a Arrival) *Write {
	for _, w := range attempts[a.ID] {
		if w.Token == a.Token {
			return w
		}
	}
	return writes[a.ID]
}

// Check applies every rule to h.
func Check(h History) Report {
	r := Report{Stats: Stats{Faults: map[string]int{}, ViolationCounts: map[string]int{}}}
	st := &r.Stats
	flag := func(rule, format string, args ...any) {
		st.ViolationCounts[rule]++
		if st.ViolationCounts[rule] <= maxExamples {
			r.Violations = append(r.Violations, Violation{Rule: rule, Detail: fmt.Sprintf(format, args...)})
		}
	}
	for _, f := range h.Faults {
		st.Faults[f.Kind]++
	}
	st.Grants, st.Writes, st.Arrivals = len(h.Grants), len(h.Writes), len(h.Arrivals)

	// No token granted twice. granted holds, per resource and token, the
	// holder of the last grant recorded and the earliest time one returned
	// to a worker.
	type grantSeen struct {
		holder string
		at     time.Time
	}
	granted := map[string]map[int64]grantSeen{}
	for _, g := range h.Grants {
		m := granted[g.Resource]
		if m == nil {
			m = map[int64]grantSeen{}
			granted[g.Resource] = m
		}
		seen := grantSeen{holder: g.Holder, at: g.Returned}
		if prev, dup := m[g.Token]; dup {
			flag(RuleDuplicateToken, "%s: token %d granted to %s and again to %s", g.Resource, g.Token, prev.holder, g.Holder)
			if prev.at.Before(seen.at) {
				seen.at = prev.at
			}
		}
		m[g.Token] = seen
	}

	// writes holds each id's first attempt; a keyed write's attempts are
	// all in attempts, in order. Any one of them may be the one that was
	// forwarded (the earlier ones may never have reached the gateway's
	// record, and a retry under a new lease carries a new token): an
	// arrival is judged against the attempt whose token it carries.
	// keyed and retried say which ids had a key and more than one attempt.
	writes := make(map[string]*Write, len(h.Writes))
	attempts := map[string][]*Write{}
	keyed, retried := map[string]bool{}, map[string]bool{}
	for i := range h.Writes {
		w := &h.Writes[i]
		if prev := writes[w.ID]; prev == nil || !w.Keyed || w.Attempt < prev.Attempt {
			writes[w.ID] = w
		}
		if w.Keyed {
			attempts[w.ID] = append(attempts[w.ID], w)
		}
		if w.Keyed {
			keyed[w.ID] = true
		}
		if w.Attempt > 1 {
			retried[w.ID] = true
		}
	}

	// A lease's owner is the holder that got its grant (the holder is its
	// API key's name). A write or lease operation is foreign if it names
	// its sender and that is not the owner; one whose lease no grant
	// records cannot be judged and is left out.
	owners := map[string]string{}
	for _, g := range h.Grants {
		if g.LeaseID != "" {
			owners[g.LeaseID] = g.Holder
		}
	}
	foreign := func(leaseID, by string) (owner string, ok bool) {
		owner, known := owners[leaseID]
		return owner, by != "" && known && owner != by
	}

	// Arrival order, arrival counts, the token the upstream got.
	arrivals := slices.Clone(h.Arrivals)
	slices.SortFunc(arrivals, func(a, b Arrival) int { return cmp.Compare(a.Seq, b.Seq) })
	last := map[string]Arrival{}
	arrived, applied := map[string]int{}, map[string]int{}
	for _, a := range arrivals {
		if prev, ok := last[a.Resource]; ok && a.Token < prev.Token {
			flag(RuleTokenOrder, "%s: write %s with token %d arrived after write %s with token %d", a.Resource, a.ID, a.Token, prev.ID, prev.Token)
		}
		if prev, ok := last[a.Resource]; !ok || a.Token >= prev.Token {
			last[a.Resource] = a
		}
		arrived[a.ID]++
		if arrived[a.ID] == 2 && keyed[a.ID] {
			flag(RuleKeyOnce, "write %s (%s, token %d) was sent with an Idempotency-Key and reached the upstream twice", a.ID, a.Resource, a.Token)
		}
		if w := writes[a.ID]; w != nil && arrived[a.ID] == 1 {
			if owner, ok := foreign(w.LeaseID, w.By); ok {
				flag(RuleForeignLease, "write %s sent by %s with lease %s of %s (%s, token %d) reached the upstream (answered %d %s)",
					a.ID, w.By, w.LeaseID, owner, a.Resource, a.Token, w.Status, w.Code)
			}
		}
		if w := writes[a.ID]; w != nil && arrived[a.ID] == 1 && w.Route != "" && w.Route != w.Resource {
			flag(RuleForeignRoute, "write %s under a lease of %s (token %d) to the path of %s reached the upstream (answered %d %s)",
				a.ID, w.Resource, w.Token, w.Route, w.Status, w.Code)
		}
		if !a.Applied.IsZero() {
			applied[a.ID]++
			st.Applied++
			if applied[a.ID] == 2 {
				flag(RuleExactlyOnce, "write %s applied more than once", a.ID)
			}
		}
		if w := sentAs(writes, attempts, a); w != nil && w.Token != a.Token {
			flag(RuleTokenMismatch, "write %s sent under token %d reached the upstream with token %d", a.ID, w.Token, a.Token)
		}
		for _, f := range h.Faults {
			if !f.DownFrom.IsZero() && a.Arrived.After(f.DownFrom) && a.Arrived.Before(f.DownTo) {
				if f.Kind == FaultRestartRedis || f.Kind == FaultRedisDownInShutdown {
					// Redis holds the leases, not the tokens: while it is
					// down no grant, renewal or release can happen, so a
					// replica that already holds the resource's fence in
					// PostgreSQL (the token store) may go on admitting the
					// lease it read before the outage. Only a lease it could
					// have learnt of from Redis during the outage is a
					// violation: one no worker had been granted before the
					// outage began.
					if g, ok := granted[a.Resource][a.Token]; ok && g.at.Before(f.Start) {
						st.HeldInOutage++
						continue
					}
				}
				flag(RuleStoreDown, "write %s (%s, token %d) arrived %v into a %s outage", a.ID, a.Resource, a.Token, a.Arrived.Sub(f.DownFrom).Round(time.Millisecond), f.Kind)
			}
		}
	}

	// What the workers saw against what arrived.
	foreignAnswered := 0 // thieves' writes that reached a gateway
	routeAnswered := 0   // route thieves' writes that reached a gateway
	for _, w := range h.Writes {
		if w.Attempt > 1 {
			st.KeyRetries++
			switch {
			case w.Status >= 200 && w.Status < 300 && w.Replayed:
				st.KeyReplayed++
			case w.Code == codeOutcomeUnknown:
				st.KeyUnknown++
			}
		}
		switch {
		case w.Status >= 200 && w.Status < 300:
			st.OK++
			if applied[w.ID] != 1 {
				flag(RuleExactlyOnce, "write %s answered %d but applied %d times", w.ID, w.Status, applied[w.ID])
			}
		case w.Status == 409 && staleCodes[w.Code]:
			st.StaleRejected++
		case w.Status == 503:
			st.Unavailable++
		case unknownOutcome(w.Status):
			st.UnknownOutcome++ // may or may not have landed: at most once (above)
		default:
			st.OtherRefused++
		}
		if w.Late || (w.Status == 409 && staleCodes[w.Code]) {
			st.StaleAttempts++
		}
		if _, ok := foreign(w.LeaseID, w.By); ok {
			st.ForeignWrites++
			if w.Status != 0 {
				foreignAnswered++
			}
			if w.Status == 403 && w.Code == codeNotOwned {
				st.ForeignRefused++
			}
		}
		if w.Route != "" && w.Route != w.Resource {
			st.RouteThefts++
			if w.Status != 0 {
				routeAnswered++
			}
			if w.Status == 403 && w.Code == codeWrongResource {
				st.RouteRefused++
			}
		}
		// A refused retry says nothing about the attempt before it, whose
		// outcome was open: only a write's sole attempt is held to this.
		if !unknownOutcome(w.Status) && ((w.Status >= 400 && w.Status < 500) || w.Status == 503) && !retried[w.ID] {
			if arrived[w.ID] > 0 {
				flag(RuleRejectedApplied, "write %s (%s, token %d) refused with %d %s but reached the upstream", w.ID, w.Resource, w.Token, w.Status, w.Code)
			}
		}
	}

	// No foreign renewal or release succeeded.
	for _, o := range h.LeaseOps {
		owner, ok := foreign(o.LeaseID, o.By)
		if !ok {
			continue
		}
		st.ForeignOps++
		switch {
		case o.Status == 403 && o.Code == codeNotOwned:
			st.ForeignRefused++
		case o.Status >= 200 && o.Status < 300:
			flag(RuleForeignLease, "%s of lease %s of %s (%s) by %s answered %d", o.Op, o.LeaseID, owner, o.Resource, o.By, o.Status)
		}
	}

	// No write applied after a grant of a larger token had returned. Per
	// resource, grants by return time with the running maximum token.
	type mark struct {
		at  time.Time
		max int64
	}
	marks := map[string][]mark{}
	byRes := map[string][]Grant{}
	for _, g := range h.Grants {
		byRes[g.Resource] = append(byRes[g.Resource], g)
	}
	for res, gs := range byRes {
		slices.SortFunc(gs, func(a, b Grant) int { return a.Returned.Compare(b.Returned) })
		ms := make([]mark, len(gs))
		var hi int64
		for i, g := range gs {
			hi = max(hi, g.Token)
			ms[i] = mark{g.Returned, hi}
		}
		marks[res] = ms
	}
	for _, a := range arrivals {
		if a.Applied.IsZero() {
			continue
		}
		token, deadline := a.Token, a.Applied
		if w := sentAs(writes, attempts, a); w != nil {
			token = w.Token // the lease it was sent under, whatever the header said
			// An unknown outcome starts a drain period no earlier than the
			// write was sent: the gateway is at fault only for a grant that
			// returned before that drain could have ended. Later, the write
			// landed after the bound the gateway was configured with.
			if h.DrainPeriod > 0 && unknownOutcome(w.Status) {
				if end := w.Sent.Add(h.DrainPeriod); end.Before(deadline) {
					deadline = end
				}
			}
		}
		ms := marks[a.Resource]
		i := sort.Search(len(ms), func(i int) bool { return !ms[i].at.Before(deadline) }) // grants returned before the deadline: ms[:i]
		if i > 0 && ms[i-1].max > token {
			flag(RuleStaleApplied, "%s: write %s of token %d applied after a grant of token %d had returned", a.Resource, a.ID, token, ms[i-1].max)
		}
	}

	switch {
	case len(h.Faults) == 0:
		r.Void = "no fault was injected"
	case st.OK == 0:
		r.Void = "no write was accepted"
	case st.StaleAttempts == 0:
		r.Void = "no stale write was attempted"
	case foreignAnswered == 0:
		r.Void = "no write sent with another principal's lease was answered"
	case routeAnswered == 0:
		r.Void = "no write sent to another resource's path was answered"
	}
	return r
}
