package auth

// Principals and roles: who a key names and what it may do.

import (
	"strconv"
	"strings"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// ErrUnauthenticated: no API key, or not a valid one. The gateway answers
// it with 401 unauthorized, HTTP's name for it (gateway.ErrUnauthenticated
// is this error). The code is written out so that auth needs only tokens;
// internal/problems' table has its row, and its test checks the two agree.
var ErrUnauthenticated = tokens.NewKind("unauthorized", "unauthenticated")

// Role is what an authenticated principal may do. Roles are ordered: each
// includes everything the ones below it may do.
type Role int

// Roles, lowest first.
const (
	// RoleViewer reads: resources, leases, the rejection log and stream,
	// the dashboard, metrics.
	RoleViewer Role = iota + 1
	// RoleWorker also acquires, renews and releases leases and sends
	// fenced writes.
	RoleWorker
	// RoleAdmin also revokes any lease.
	RoleAdmin
)

func (r Role) String() string {
	switch r {
	case RoleViewer:
		return "viewer"
	case RoleWorker:
		return "worker"
	case RoleAdmin:
		return "admin"
	}
	return "role(" + strconv.Itoa(int(r)) + ")"
}

// Principal is an authenticated caller: one API key.
type Principal struct {
	// Name identifies the key; leases are bound to it (tokens.Lease.Owner)
	// and revocations are recorded under it.
	Name string
	Role Role
	// Resources are the resource-name prefixes the key may use; empty
	// means every resource.
	Resources []string
	// MaxTTL caps the ttl_ms of the key's acquires and renewals (0: only
	// the gateway's limit).
	MaxTTL time.Duration
	// MaxLeases caps the key's live leases at once (0: no cap). The store
	// counts them in the step that writes a lease
	// (tokens.GrantRequest.MaxLeases), so concurrent acquires, on any
	// replica, never overshoot it.
	MaxLeases int
	// Rate is the key's requests/s (0: unlimited) and Burst the most it may
	// save up (at least 1 when Rate is set): what a bucket shared by every
	// replica is taken with (gateway.RateStore), so that a reload's new
	// values apply at the next request.
	Rate  float64
	Burst int
}

// MayUse reports whether p may use resource (a prefix match).
func (p *Principal) MayUse(resource string) bool {
	if len(p.Resources) == 0 {
		return true
	}
	for _, prefix := range p.Resources {
		if strings.HasPrefix(resource, prefix) {
			return true
		}
	}
	return false
}
