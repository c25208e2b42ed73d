package redis

// Forwarded-write counts, kept in the PostgreSQL ledger.

import (
	"context"
	"errors"

	"github.com/fencegw/fencegw/tokens"
)

var _ tokens.WriteCounter = (*Store)(nil)

var errNoWriteCounts = errors.New("the ledger keeps no write counts")

// AddWrites keeps write counts in the Ledger (PostgreSQL), like the
// rejection log.
func (s *Store) AddWrites(ctx context.Context, batch []tokens.TokenWrites) error {
	wc, ok := s.ledger.(tokens.WriteCounter)
	if !ok {
		return tokens.Unavailable("add writes", errNoWriteCounts)
	}
	return wc.AddWrites(ctx, batch)
}

// Writes reads write counts from the Ledger.
func (s *Store) Writes(ctx context.Context, resource string, toks []int64) (map[int64]uint64, error) {
	wc, ok := s.ledger.(tokens.WriteCounter)
	if !ok {
		return nil, tokens.Unavailable("writes", errNoWriteCounts)
	}
	return wc.Writes(ctx, resource, toks)
}
