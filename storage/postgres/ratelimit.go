package postgres

// The API keys' request budgets shared by every replica
// (gateway.RateStore): a token bucket per key in rate_buckets.

import (
	"context"
	"time"
)

// takeSQL refills the key's bucket by the database's clock and takes one
// token if there is one, in one statement: the row lock the upsert takes
// orders concurrent takes on every replica, so a key never gets more than
// its burst plus its rate. The rate and burst come with each call (a
// reload's apply at once); a bucket over a lowered burst is cut to it.
// Elapsed time is never negative, so a clock stepped back refills nothing.
const takeSQL = `
INSERT INTO rate_buckets AS b (key_name, tokens, refilled_at, taken)
VALUES ($1, $3::float8 - 1, clock_timestamp(), true)
ON CONFLICT (key_name) DO UPDATE SET
    tokens = CASE WHEN ` + refilledSQL + ` >= 1 THEN ` + refilledSQL + ` - 1 ELSE ` + refilledSQL + ` END,
    refilled_at = greatest(b.refilled_at, EXCLUDED.refilled_at),
    taken = ` + refilledSQL + ` >= 1
RETURNING b.taken, b.tokens`

// refilledSQL is the bucket's tokens now, before the take (SET reads the
// row as it was): EXCLUDED.refilled_at is this statement's clock_timestamp().
const refilledSQL = `least($3::float8, b.tokens + $2::float8 *
    greatest(0, extract(epoch FROM EXCLUDED.refilled_at - b.refilled_at)::float8))`

// Take implements gateway.RateStore.
func (s *Store) Take(ctx context.Context, key string, rate float64, burst int) (bool, time.Duration, error) {
	if rate <= 0 {
		return true, 0, nil // unlimited
	}
	burst = max(burst, 1)
	var ok bool
	var tokens float64
	if err := s.pool.QueryRow(ctx, takeSQL, key, rate, float64(burst)).Scan(&ok, &tokens); err != nil {
		return false, 0, s.interpret("take rate", err)
	}
	if ok {
		return true, 0, nil
	}
	return false, time.Duration((1 - tokens) / rate * float64(time.Second)), nil
}
