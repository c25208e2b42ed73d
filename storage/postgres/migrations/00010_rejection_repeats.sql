-- +goose Up
-- repeats: how many refusals the row stands for; first_at: when the first
-- of them was (NULL: at, for a row from a replica that predates counting).
-- A refusal with the same (resource, lease_hint, token, code, principal,
-- would_refuse) as
-- a row is counted on the latest such row (rejections.go). Both columns
-- have defaults and the index is not unique, so a replica that predates
-- them keeps inserting plain rows, each a single refusal.
ALTER TABLE rejections ADD COLUMN repeats bigint NOT NULL DEFAULT 1,
	ADD COLUMN first_at timestamptz;
CREATE INDEX rejections_repeat_key ON rejections (resource, lease_hint, token, code, principal, id DESC);

-- +goose Down
DROP INDEX rejections_repeat_key;
ALTER TABLE rejections DROP COLUMN repeats, DROP COLUMN first_at;
