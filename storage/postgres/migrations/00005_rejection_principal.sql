-- +goose Up
-- principal: the authenticated caller that presented the lease of a refused
-- write ('' without authentication). For lease_not_owned it is the caller
-- that tried another principal's lease, while holder is the lease's own.
ALTER TABLE rejections ADD COLUMN principal text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE rejections DROP COLUMN principal;
