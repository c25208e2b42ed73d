-- +goose Up
-- owner: the authenticated principal that acquired the lease ('' when the
-- gateway ran without authentication). Only it may write, renew or release.
ALTER TABLE leases ADD COLUMN owner text NOT NULL DEFAULT '';
-- actor: who caused an event when it was not the holder (the administrator
-- who revoked a lease).
ALTER TABLE lease_events ADD COLUMN actor text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE lease_events DROP COLUMN actor;
ALTER TABLE leases DROP COLUMN owner;
