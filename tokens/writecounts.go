package tokens

// The optional store interface for counts of forwarded writes per token.

import "context"

// TokenWrites is a number of writes forwarded under one token.
type TokenWrites struct {
	Resource string
	Token    int64
	N        uint64
}

// WriteCounter keeps, durably and across replicas, how many writes were
// forwarded under each token: the dashboard's proof that exactly one
// holder wrote. It is told in batches (the write path never waits on it),
// so a crash loses at most the last unflushed batch.
//
// Optional: a Store that is also a WriteCounter gets its counts kept;
// otherwise they stay in each process's memory.
type WriteCounter interface {
	// AddWrites adds each N to its (Resource, Token) count, atomically for
	// the whole batch.
	AddWrites(ctx context.Context, batch []TokenWrites) error
	// Writes returns the counts of resource's given tokens (absent: none
	// counted).
	Writes(ctx context.Context, resource string, tokens []int64) (map[int64]uint64, error)
}
