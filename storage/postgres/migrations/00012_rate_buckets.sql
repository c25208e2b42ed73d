-- +goose Up
-- The API keys' request budgets, shared by every replica (ratelimit.go):
-- one token bucket per key, refilled by the database's clock. A take
-- writes taken, the outcome its RETURNING reports.
CREATE TABLE rate_buckets (
    key_name    text PRIMARY KEY,
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    taken       boolean NOT NULL
);

-- +goose Down
DROP TABLE rate_buckets;
