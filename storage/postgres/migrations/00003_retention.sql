-- +goose Up
-- Retention (retention.go) deletes leases whose expiry is long past; a
-- lease never ends after its expires_at, so this index finds them all.
CREATE INDEX leases_expires_at ON leases (expires_at);

-- +goose Down
DROP INDEX leases_expires_at;
