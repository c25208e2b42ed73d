//go:build !fencegw_break_no_owner

package tokens

// breakNoOwner is true only in the deliberately broken build
// (go build -tags fencegw_break_no_owner) that cmd/fencegw-torture must
// catch: it skips the lease-owner checks of Admit, Renew and Release. In
// the normal build the branches compile away.
const breakNoOwner = false
