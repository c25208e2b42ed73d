//go:build !fencegw_break_not_durable

package bolt

import "github.com/fencegw/fencegw/tokens"

// breakNotDurable is true only in the deliberately broken build
// (go build -tags fencegw_break_not_durable) that cmd/fencegw-torture must
// catch. In the normal build the branch compiles away.
const breakNotDurable = false

func (s *Store) grantBeforeDurable(tokens.GrantRequest) (tokens.Lease, error) {
	panic("unreachable")
}
