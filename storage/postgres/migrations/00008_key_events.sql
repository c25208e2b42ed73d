-- +goose Up
-- lease_events.idempotency: the facts of a lease history event about an
-- Idempotency-Key (a retry replayed from its record, or refused because the
-- first attempt's outcome is unknown or it was another request): which key,
-- on which upstream, and the first attempt it refers to (tokens.KeyEvent as
-- JSON). NULL for every other event.
ALTER TABLE lease_events ADD COLUMN idempotency jsonb;

-- +goose Down
ALTER TABLE lease_events DROP COLUMN idempotency;
