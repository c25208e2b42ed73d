-- +goose Up
-- idempotency_keys: one row per idempotency key in use, scoped by resource,
-- upstream and principal ('' without authentication). A row is written as
-- in_progress before the write is forwarded and finished (completed, with
-- the upstream's answer, or unknown) when the request ends: before the
-- answer goes back if the store takes it within a second, in the
-- background otherwise (docs/idempotency.md, "When the store is slow").
-- seq is the insertion order: past the bound, the oldest go first. owner is the
-- gateway process that began the row: on a clean shutdown it turns its own
-- rows still in progress into unknown outcomes; a crashed one's rows turn
-- unknown at their deadline.
CREATE TABLE idempotency_keys (
    resource     text        NOT NULL,
    upstream     text        NOT NULL,
    principal    text        NOT NULL,
    key          text        NOT NULL,
    seq          bigserial   NOT NULL,
    attempt      text        NOT NULL,
    owner        text        NOT NULL,
    fingerprint  text        NOT NULL,
    state        text        NOT NULL CHECK (state IN ('in_progress', 'completed', 'unknown')),
    token        bigint      NOT NULL,
    started_at   timestamptz NOT NULL,
    deadline     timestamptz NOT NULL,
    completed_at timestamptz,
    expires_at   timestamptz NOT NULL,
    status       integer,
    header       jsonb,
    body         bytea,
    body_omitted boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (resource, upstream, principal, key)
);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
CREATE INDEX idempotency_keys_seq ON idempotency_keys (seq);
CREATE INDEX idempotency_keys_in_progress ON idempotency_keys (owner) WHERE state = 'in_progress';

-- +goose Down
DROP TABLE idempotency_keys;
