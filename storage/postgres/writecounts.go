package postgres

// Forwarded-write counts per resource and token (tokens.WriteCounter).

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/tokens"
)

var _ tokens.WriteCounter = (*Store)(nil)

// AddWrites implements tokens.WriteCounter: one upsert statement for the
// batch. Rows are sent in (resource, token) order, so that two replicas
// flushing overlapping batches lock the rows in the same order and cannot
// deadlock.
func (s *Store) AddWrites(ctx context.Context, batch []tokens.TokenWrites) error {
	if len(batch) == 0 {
		return nil
	}
	batch = slices.Clone(batch)
	slices.SortFunc(batch, func(a, b tokens.TokenWrites) int {
		return cmp.Or(strings.Compare(a.Resource, b.Resource), cmp.Compare(a.Token, b.Token))
	})
	res := make([]string, len(batch))
	toks := make([]int64, len(batch))
	ns := make([]int64, len(batch))
	for i, w := range batch {
		res[i], toks[i], ns[i] = w.Resource, w.Token, int64(w.N)
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO write_counts (resource, token, writes)
		SELECT r, t, n FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS b(r, t, n)
		ON CONFLICT (resource, token) DO UPDATE SET writes = write_counts.writes + EXCLUDED.writes`, res, toks, ns)
	return s.interpret("add writes", err)
}

// Writes implements tokens.WriteCounter.
func (s *Store) Writes(ctx context.Context, resource string, toks []int64) (map[int64]uint64, error) {
	out := map[int64]uint64{}
	if len(toks) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT token, writes FROM write_counts WHERE resource = $1 AND token = ANY($2)`, resource, toks)
	if err != nil {
		return nil, s.interpret("writes", err)
	}
	var tok, n int64
	_, err = pgx.ForEachRow(rows, []any{&tok, &n}, func() error {
		out[tok] = uint64(n)
		return nil
	})
	if err != nil {
		return nil, s.interpret("writes", err)
	}
	return out, nil
}
