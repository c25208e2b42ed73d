package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// BenchmarkSharedLock compares the shared lock a write would take on one
// hot resource: a session advisory lock, the kind this package uses (the
// fence's lock sessions hold them, locker.go argues the choice), against a
// row lock (SELECT ... FOR SHARE on the fences row, in a transaction held
// like the advisory lock). Reported: ns/op and WAL bytes/op. Run alone:
//
//	go test -run '^$' -bench SharedLock -benchtime 3s ./storage/postgres/
func BenchmarkSharedLock(b *testing.B) {
	s := pgtest.OpenFresh(b)
	ctx := context.Background()
	b.Run("advisory", func(b *testing.B) {
		key := s.LockKey("hot-advisory")
		wal := walMeter(b)
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				err := func() error {
					conn, err := s.Pool().Acquire(ctx)
					if err != nil {
						return err
					}
					defer conn.Release()
					if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock_shared($1)", key); err != nil {
						return err
					}
					_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock_shared($1)", key)
					return err
				}()
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		wal()
	})
	b.Run("for-share", func(b *testing.B) {
		cfg, err := pgxpool.ParseConfig(pgtest.URL())
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = 128
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS fencegw_bench_hot (resource text PRIMARY KEY, token bigint); INSERT INTO fencegw_bench_hot VALUES ('hot', 1) ON CONFLICT DO NOTHING"); err != nil {
			b.Fatal(err)
		}
		defer pool.Exec(ctx, "DROP TABLE fencegw_bench_hot")
		wal := walMeter(b)
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "SELECT 1 FROM fencegw_bench_hot WHERE resource = 'hot' FOR SHARE")
					return err
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		wal()
	})
}

// walMeter reports the WAL written between its call and the returned func's.
func walMeter(b *testing.B) func() {
	conn, err := pgx.Connect(context.Background(), pgtest.URL())
	if err != nil {
		b.Fatal(err)
	}
	var start string
	if err := conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&start); err != nil {
		b.Fatal(err)
	}
	return func() {
		defer conn.Close(context.Background())
		var bytes float64
		if err := conn.QueryRow(context.Background(), "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)", start).Scan(&bytes); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(bytes/float64(b.N), "WAL-B/op")
	}
}
