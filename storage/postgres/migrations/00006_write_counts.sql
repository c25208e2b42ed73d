-- +goose Up
-- write_counts: writes forwarded under each token, added to in batches by
-- every replica (the dashboard's "writes accepted under it").
CREATE TABLE write_counts (
    resource text   NOT NULL,
    token    bigint NOT NULL,
    writes   bigint NOT NULL CHECK (writes >= 0),
    PRIMARY KEY (resource, token)
);

-- +goose Down
DROP TABLE write_counts;
