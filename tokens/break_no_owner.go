//go:build fencegw_break_no_owner

package tokens

// Deliberately broken: no binding between a lease and the principal that
// acquired it. Admit forwards a write sent with another key's lease id, and
// Renew and Release let any key extend or end any lease.
const breakNoOwner = true
