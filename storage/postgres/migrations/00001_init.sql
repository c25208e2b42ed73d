-- +goose Up
-- fences: one row per resource ever granted. token is the last granted token
-- (never decreases, never reused); lease_id the lease that got it.
CREATE TABLE fences (
    resource    text        PRIMARY KEY,
    token       bigint      NOT NULL DEFAULT 0 CHECK (token >= 0),
    lease_id    text,
    drain_until timestamptz -- NULL: not draining
);

-- leases: every grant. A lease is current while it is unreleased and not
-- superseded; live while current and expires_at > now() (database clock).
-- superseded_at is set by the grant that replaces it, on the lease row
-- itself, so that a concurrent renew re-checks it after the grant commits.
CREATE TABLE leases (
    id            text        PRIMARY KEY,
    resource      text        NOT NULL REFERENCES fences (resource),
    holder        text        NOT NULL,
    token         bigint      NOT NULL,
    ttl_ms        bigint      NOT NULL CHECK (ttl_ms > 0),
    granted_at    timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    released_at   timestamptz,
    superseded_at timestamptz,
    UNIQUE (resource, token)
);
CREATE INDEX leases_current_by_expiry ON leases (expires_at)
    WHERE released_at IS NULL AND superseded_at IS NULL;

-- lease_events: the lease history (grants, renewals, releases and refused
-- renewals/releases), written in the same transaction as the change.
CREATE TABLE lease_events (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL,
    resource   text        NOT NULL,
    kind       text        NOT NULL,
    token      bigint      NOT NULL,
    holder     text        NOT NULL,
    expires_at timestamptz
);
CREATE INDEX lease_events_resource_id ON lease_events (resource, id DESC);

-- rejections: refused writes. Never a whole lease id, never a body.
CREATE TABLE rejections (
    id             bigserial   PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    resource       text        NOT NULL,
    code           text        NOT NULL,
    token          bigint      NOT NULL,
    current_token  bigint      NOT NULL,
    holder         text        NOT NULL,
    lease_hint     text        NOT NULL,
    method         text        NOT NULL,
    upstream       text        NOT NULL,
    path           text        NOT NULL,
    lease_ended_at timestamptz
);
CREATE INDEX rejections_resource_id ON rejections (resource, id DESC);
CREATE INDEX rejections_at ON rejections (at);

-- +goose Down
DROP TABLE rejections;
DROP TABLE lease_events;
DROP TABLE leases;
DROP TABLE fences;
