-- +goose Up
-- A grant under its owner's cap counts the owner's live leases (store.go,
-- countOwner): this index finds them without reading the owner's ended
-- leases or anyone else's.
CREATE INDEX leases_current_by_owner ON leases (owner, expires_at)
    WHERE released_at IS NULL AND superseded_at IS NULL AND owner <> '';

-- +goose Down
DROP INDEX leases_current_by_owner;
