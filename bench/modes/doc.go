// Package modes measures grants and fenced writes in each storage mode —
// embedded (bbolt), PostgreSQL, PostgreSQL + Redis — on one hot resource
// and spread over 1,000 resources, next to the raw rates of the operations
// underneath (a PostgreSQL single-row UPDATE, a Redis SET NX PX). Each
// gateway is a replica built as fencegw serve builds it (replica.New,
// through bench.StartModeGateway), with serve's defaults. Everything
// is in the tests: `go test ./bench/modes/` runs a quick sanity check of
// every mode; the figures come from `go test -run '^$' -bench . ./bench/modes/`
// and are written down in docs/operations.md ("Measured").
package modes
