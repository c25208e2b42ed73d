//go:build !fencegw_break_highest_seen

package tokens

// breakHighestSeen is true only in the deliberately broken build
// (go build -tags fencegw_break_highest_seen) that cmd/fencegw-torture must
// catch. In the normal build the branch compiles away.
const breakHighestSeen = false

func judgeHighestSeen(Lease) error { return nil }
