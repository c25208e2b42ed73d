package replica

import (
	"context"

	"github.com/fencegw/fencegw/tokens"
)

// The mode's lock with its exclusive side replaced by Config.WrapExcluder's
// wrapping of it: writes keep the mode's own Shared or Hold.

type wrappedLocker struct {
	tokens.Locker
	exclusive tokens.Excluder
}

func (l wrappedLocker) Exclusive(ctx context.Context, resource string) (func(), error) {
	return l.exclusive.Exclusive(ctx, resource)
}

type wrappedFencer struct {
	tokens.Fencer
	exclusive tokens.Excluder
}

func (f wrappedFencer) Exclusive(ctx context.Context, resource string) (func(), error) {
	return f.exclusive.Exclusive(ctx, resource)
}
