// Package torture is fencegw's fault-injection torture: worker processes
// that take leases with short TTLs and write through the gateway, a
// recording upstream that logs what actually arrived, a nemesis that kills,
// pauses and restarts the gateway and its stores and delays or drops
// upstream answers, and a checker that compares the upstream's ground truth
// with what every client saw. cmd/fencegw-torture runs it.
package torture

import "time"

// Grant is a lease as the worker that got it saw it.
type Grant struct {
	Resource string `json:"r"`
	Token    int64  `json:"t"`
	// Holder is the worker; with authentication (the torture always has
	// it) it is also the name of the worker's API key: the lease's owner.
	Holder   string    `json:"h"`
	LeaseID  string    `json:"l,omitempty"`
	Returned time.Time `json:"at"` // when the worker had the answer
}

// Write is one fenced write as the worker that sent it saw it.
type Write struct {
	ID       string    `json:"id"`
	Resource string    `json:"r"`
	Token    int64     `json:"t"` // the token of the lease it was sent under
	Status   int       `json:"s"` // 0: no answer (connection failed or timed out)
	Code     string    `json:"c,omitempty"`
	Sent     time.Time `json:"sent"`
	Returned time.Time `json:"ret"`
	// Late is set if the worker sent it after its lease's TTL had run out by
	// its own clock: a stale-write attempt, whatever the gateway answered.
	Late bool `json:"late,omitempty"`
	// LeaseID and By are set on a thief's write: sent with lease LeaseID
	// by the principal (API key) By, which did not acquire it. The checker
	// finds the lease's owner in the grants.
	LeaseID string `json:"l,omitempty"`
	By      string `json:"by,omitempty"`
	// Keyed: sent with Idempotency-Key set to its ID. Attempt counts its
	// tries under that key from 1: a retry (Attempt > 1) is sent only after
	// an unknown outcome or an in-progress answer, under the same lease.
	Keyed   bool `json:"k,omitempty"`
	Attempt int  `json:"a,omitempty"`
	// Replayed: a 2xx answered from the gateway's record (Idempotent-Replayed).
	Replayed bool `json:"rp,omitempty"`
	// Route is set on a route theft: a write sent, under a live lease of
	// Resource held by its sender, to the path of the resource Route, whose
	// route binds it to another resource. The gateway must refuse it (403
	// resource_mismatch); the upstream must never get it.
	Route string `json:"route,omitempty"`
}

// Lease operations a thief tries with another principal's lease.
const (
	OpRenew   = "renew"
	OpRelease = "release"
)

// LeaseOp is a renewal or release that a thief sent with a lease id another
// principal acquired, as the thief saw it.
type LeaseOp struct {
	Op       string    `json:"op"` // OpRenew or OpRelease
	LeaseID  string    `json:"l"`
	By       string    `json:"by"` // the principal (API key) that sent it
	Resource string    `json:"r"`
	Status   int       `json:"s"` // 0: no answer
	Code     string    `json:"c,omitempty"`
	Sent     time.Time `json:"sent"`
	Returned time.Time `json:"ret"`
}

// Arrival is a request the upstream received: the ground truth.
type Arrival struct {
	Seq      int64     `json:"seq"` // arrival order at the upstream
	Resource string    `json:"r"`   // Fencing-Resource
	Token    int64     `json:"t"`   // Fencing-Token
	ID       string    `json:"id"`  // the write id, from the body
	Arrived  time.Time `json:"arr"`
	// Applied is when the upstream acted on it; zero if it dropped the
	// connection without acting.
	Applied time.Time `json:"app,omitzero"`
}

// Fault is one nemesis action.
type Fault struct {
	Kind  string    `json:"kind"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// DownFrom..DownTo, if set, is a window in which the token or lease
	// store was certainly unreachable: nothing may be forwarded in it.
	DownFrom time.Time `json:"down_from,omitzero"`
	DownTo   time.Time `json:"down_to,omitzero"`
}

// History is everything a run recorded.
type History struct {
	Grants   []Grant   `json:"grants"`
	Writes   []Write   `json:"writes"`
	Arrivals []Arrival `json:"arrivals"`
	Faults   []Fault   `json:"faults"`
	LeaseOps []LeaseOp `json:"lease_ops,omitempty"` // the thieves' renewals and releases
	// DrainPeriod is the gateway's --drain-period. A write whose outcome
	// was unknown may land up to a drain period after it was sent without
	// the gateway being at fault; zero holds such writes to the strict rule.
	DrainPeriod time.Duration `json:"drain_period"`
}
