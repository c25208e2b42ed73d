package web

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// How a resource's timeline is laid out for people: newest first, one page
// of rows at a time, runs of routine lease traffic folded into one row, and
// the incidents (refused writes and the events that explain them) never
// folded and marked.
const (
	// timelineRows is one page of the timeline, after folding.
	timelineRows = 50
	// minRun is the shortest run of routine steps folded into one row.
	minRun = 3
	// runHolders is how many holders a folded row names.
	runHolders = 3
)

// StepRun is a row that stands for a run of routine steps.
const StepRun StepKind = "run"

// StepRevoked: an administrator ended the lease.
const StepRevoked StepKind = "revoked"

// Run sums up routine steps (grants, renewals, releases and expiries that
// explain no refused write) folded into one row of the timeline.
type Run struct {
	Steps    int       `json:"steps"`
	Grants   int       `json:"grants"`
	Renewals int       `json:"renewals"`
	Releases int       `json:"releases"`
	Expiries int       `json:"expiries"`
	Holders  []string  `json:"holders"`
	More     int       `json:"more_holders,omitempty"`
	From     time.Time `json:"from"`
	To       time.Time `json:"to"`
	// FirstToken, LastToken: the range of tokens granted in the run (0 if
	// the run granted none).
	FirstToken int64 `json:"first_token,omitempty"`
	LastToken  int64 `json:"last_token,omitempty"`
}

// Account is the timeline's one-line summary of its newest incident: who
// wrote stale, how long after its lease ended, who held the resource.
type Account struct {
	Holder       string        `json:"holder"`
	Token        int64         `json:"token"`
	Code         string        `json:"code"`
	At           time.Time     `json:"at"`
	Count        int           `json:"count"`
	Last         time.Time     `json:"last,omitzero"`
	LeaseEnd     StepKind      `json:"lease_end,omitempty"` // how its lease ended, if in the history
	LeaseEndedAt time.Time     `json:"lease_ended_at,omitzero"`
	After        time.Duration `json:"after_ns,omitempty"`
	CurrentToken int64         `json:"current_token"`
	// CurrentHolder holds (or held) CurrentToken; empty if its grant is
	// not in the history read.
	CurrentHolder  string    `json:"current_holder,omitempty"`
	CurrentGranted time.Time `json:"current_granted_at,omitzero"`
	// Incidents is how many refused-write rows the history read holds.
	Incidents int `json:"incidents"`
}

// routine reports whether a step is everyday lease traffic.
func routine(s Step) bool {
	switch s.Kind {
	case StepGranted, StepRenewed, StepReleased, StepExpired:
		return !s.Incident
	}
	return false
}

// lay turns the steps of a timeline (oldest first, in story order) into
// what the page shows: incidents marked, the account of the newest one,
// newest first, routine runs folded, and page (1-based) of the rows.
func (tl *Timeline) lay(steps []Step, page int) {
	// Mark each refused write and what explains it: the grant of its
	// token, the end of its lease (expiry, release, revocation, a refused
	// renewal or release) and the grant that superseded it.
	type key struct {
		kind  StepKind
		token int64
	}
	at := map[key][]int{}
	for i, s := range steps {
		at[key{s.Kind, s.Token}] = append(at[key{s.Kind, s.Token}], i)
	}
	var newest = -1
	for i := range steps {
		s := &steps[i]
		if s.Kind != StepRejected {
			continue
		}
		s.Incident = true
		tl.Account.Incidents++
		newest = i
		for _, k := range []key{
			{StepExpired, s.Token}, {StepReleased, s.Token}, {StepRevoked, s.Token},
			{StepRenewRefused, s.Token}, {StepReleaseRefused, s.Token}, {StepGranted, s.CurrentToken}, {StepGranted, s.Token},
		} {
			for _, j := range at[k] {
				steps[j].Incident = true
			}
		}
	}
	if newest >= 0 {
		s := steps[newest]
		a := &tl.Account
		a.Holder, a.Token, a.Code, a.At, a.Count, a.Last, a.CurrentToken = s.Holder, s.Token, s.Code, s.At, s.Count, s.Last, s.CurrentToken
		a.LeaseEndedAt = s.LeaseEndedAt
		for _, kind := range []StepKind{StepExpired, StepReleased, StepRevoked} {
			if js := at[key{kind, s.Token}]; len(js) > 0 {
				a.LeaseEnd = kind
				if a.LeaseEndedAt.IsZero() {
					a.LeaseEndedAt = steps[js[0]].At
				}
				break
			}
		}
		if !a.LeaseEndedAt.IsZero() {
			a.After = s.At.Sub(a.LeaseEndedAt)
		}
		if js := at[key{StepGranted, s.CurrentToken}]; len(js) > 0 && s.CurrentToken != s.Token {
			g := steps[js[0]]
			a.CurrentHolder, a.CurrentGranted = g.Holder, g.At
		}
	}

	slices.Reverse(steps) // newest first
	var rows []Step
	for i := 0; i < len(steps); {
		j := i
		for j < len(steps) && routine(steps[j]) {
			j++
		}
		if j-i >= minRun {
			rows = append(rows, foldBlock(steps[i:j])...)
			i = j
			continue
		}
		if j == i {
			j++
		}
		rows = append(rows, steps[i:j]...)
		i = j
	}

	tl.Rows = len(rows)
	tl.Pages = max(1, (len(rows)+timelineRows-1)/timelineRows)
	tl.Page = min(max(page, 1), tl.Pages)
	from := (tl.Page - 1) * timelineRows
	tl.Steps = rows[from:min(from+timelineRows, len(rows))]
}

// foldBlock folds a block of routine steps (newest first) into rows: a
// stretch of minRun or more steps by one holder is a row of its own ("40
// grants and 40 releases by warm-up"); the short stretches between them
// (holders taking turns) fold together, or stay as they are if fewer than
// minRun.
func foldBlock(block []Step) []Step {
	var rows, mixed []Step
	flush := func() {
		if len(mixed) >= minRun {
			rows = append(rows, fold(mixed))
		} else {
			rows = append(rows, mixed...)
		}
		mixed = nil
	}
	for i := 0; i < len(block); {
		j := i + 1
		for j < len(block) && block[j].Holder == block[i].Holder {
			j++
		}
		if j-i >= minRun {
			flush()
			rows = append(rows, fold(block[i:j]))
		} else {
			mixed = append(mixed, block[i:j]...)
		}
		i = j
	}
	flush()
	return rows
}

// fold sums up routine steps, newest first, into one row.
func fold(steps []Step) Step {
	r := &Run{Steps: len(steps), From: steps[len(steps)-1].At, To: steps[0].At}
	seen := map[string]bool{}
	for i := len(steps) - 1; i >= 0; i-- { // oldest first: holders in order of appearance
		s := steps[i]
		switch s.Kind {
		case StepGranted:
			r.Grants++
			if r.FirstToken == 0 {
				r.FirstToken = s.Token
			}
			r.LastToken = s.Token
		case StepRenewed:
			r.Renewals++
		case StepReleased:
			r.Releases++
		case StepExpired:
			r.Expiries++
		}
		if !seen[s.Holder] {
			seen[s.Holder] = true
			if len(r.Holders) < runHolders {
				r.Holders = append(r.Holders, s.Holder)
			} else {
				r.More++
			}
		}
	}
	return Step{At: r.From, Last: r.To, Kind: StepRun, Run: r}
}

// What sums up the run's steps: "40 grants and 40 releases",
// "3 grants, 2 renewals and 3 expiries".
func (r *Run) What() string {
	var parts []string
	for _, p := range []struct {
		n         int
		one, many string
	}{{r.Grants, "grant", "grants"}, {r.Renewals, "renewal", "renewals"}, {r.Releases, "release", "releases"}, {r.Expiries, "expiry", "expiries"}} {
		if p.n > 0 {
			parts = append(parts, strconv.Itoa(p.n)+" "+plural(p.n, p.one, p.many))
		}
	}
	if len(parts) <= 1 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}
