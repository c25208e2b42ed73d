-- +goose Up
-- would_refuse: the write was forwarded by an upstream that only observes,
-- and code is what an enforcing one would have refused it with. trace_id:
-- the write's OpenTelemetry trace id ('' when not traced). Both have
-- defaults, so a replica that predates them keeps inserting and reading.
ALTER TABLE rejections ADD COLUMN would_refuse boolean NOT NULL DEFAULT false,
	ADD COLUMN trace_id text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE rejections DROP COLUMN would_refuse, DROP COLUMN trace_id;
