package redis_test

import (
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/storage/feed"
	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/redis"
	"github.com/fencegw/fencegw/storage/storagetest"
)

// The live feed over Redis pub/sub (the PostgreSQL+Redis mode): replicas
// share a key prefix and a schema, each with its own Redis client, named so
// that its subscriptions can be found and killed.
func TestFeedConformance(t *testing.T) {
	client(t, -1)
	pgtest.Require(t)
	storagetest.RunFeed(t, storagetest.FeedHarness{
		Deploy: func(t *testing.T, n int) storagetest.FeedDeployment {
			schema, pre := pgtest.NewSchema(t), prefix(t)
			name := strings.TrimSuffix(pre, ":")
			var d storagetest.FeedDeployment
			for range n {
				opt, err := goredis.ParseURL(redisURL())
				if err != nil {
					t.Fatal(err)
				}
				opt.ClientName = name
				rdb := goredis.NewClient(opt)
				t.Cleanup(func() { rdb.Close() })
				ledger := pgtest.Open(t, schema, postgres.Options{})
				d.Transports = append(d.Transports, feed.Transport(redis.New(rdb, ledger, redis.Options{Prefix: pre})))
			}
			admin := client(t, -1)
			d.KillListeners = func(t *testing.T) {
				list, err := admin.ClientList(t.Context()).Result()
				if err != nil {
					t.Fatal(err)
				}
				killed := 0
				for line := range strings.SplitSeq(list, "\n") {
					f := strings.Fields(line)
					if !contains(f, "name="+name) || contains(f, "sub=0") {
						continue
					}
					id := strings.TrimPrefix(f[0], "id=")
					if err := admin.Do(t.Context(), "CLIENT", "KILL", "ID", id).Err(); err != nil {
						t.Fatal(err)
					}
					killed++
				}
				if killed == 0 {
					t.Fatal("no subscribed client to kill")
				}
			}
			return d
		},
	})
}

func contains(fields []string, f string) bool {
	for _, x := range fields {
		if x == f {
			return true
		}
	}
	return false
}
