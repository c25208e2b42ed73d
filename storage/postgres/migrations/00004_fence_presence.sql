-- +goose Up
-- fence_presence: one row per resource whose shared fence a replica's lock
-- session holds (storage/postgres/fence.go). A replica keeps a fence across
-- many writes and admits them without asking the database, so the fence
-- outlives any one write; the row says "this session may have writes in
-- flight on this resource". A clean give-up deletes the row with the
-- unlock. A row whose session no longer exists (the replica died, or lost
-- its session) is an orphan: the next exclusive holder of the resource
-- (a grant, release or revoke) deletes it and starts a drain period,
-- because a write that replica forwarded may still land.
-- (backend_pid, backend_start) names a session: pids are reused.
CREATE TABLE fence_presence (
    resource      text        NOT NULL,
    backend_pid   integer     NOT NULL,
    backend_start timestamptz NOT NULL,
    replica       text        NOT NULL,
    since         timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (resource, backend_pid, backend_start)
);

-- +goose Down
DROP TABLE fence_presence;
