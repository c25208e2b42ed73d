package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/storage/feed"
	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/storagetest"
)

// The live feed over NOTIFY/LISTEN (the PostgreSQL mode): replicas are
// Stores on one schema, whose channel they share.
func TestFeedConformance(t *testing.T) {
	pgtest.Require(t)
	storagetest.RunFeed(t, storagetest.FeedHarness{
		Deploy: func(t *testing.T, n int) storagetest.FeedDeployment {
			schema := pgtest.NewSchema(t)
			var d storagetest.FeedDeployment
			var channel string
			for range n {
				s := pgtest.Open(t, schema, postgres.Options{})
				channel = s.Channel()
				d.Transports = append(d.Transports, feed.Transport(s))
			}
			d.KillListeners = func(t *testing.T) {
				conn, err := pgx.Connect(t.Context(), pgtest.URL())
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(context.Background())
				var killed int
				err = conn.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = $1`,
					"LISTEN "+pgx.Identifier{channel}.Sanitize()).Scan(&killed)
				if err != nil {
					t.Fatal(err)
				}
				if killed == 0 {
					t.Fatal("no listening session to kill")
				}
			}
			return d
		},
	})
}
