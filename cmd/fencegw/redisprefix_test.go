package main

// Two deployments on one PostgreSQL database (two schemas) and one Redis
// database share nothing: leases, the live rejection stream and fences.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/redis"
)

// sharedRedis is the test Redis (FENCEGW_TEST_REDIS, or the local one),
// shared with other tests: only keys under this test's prefixes are read.
func sharedRedis(t *testing.T) (string, *goredis.Client) {
	t.Helper()
	url := os.Getenv("FENCEGW_TEST_REDIS")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatalf("FENCEGW_TEST_REDIS: %v", err)
	}
	rdb := goredis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		missing(t, "Redis unreachable at "+url+": "+err.Error())
	}
	return url, rdb
}

// rejectionStream is a subscriber of a gateway's /v1/rejections/stream:
// the resources of the rejections it hears, in order.
type rejectionStream struct {
	resources chan string
}

func openRejectionStream(t *testing.T, base string) *rejectionStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/rejections/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		t.Fatalf("stream: %s", resp.Status)
	}
	s := &rejectionStream{resources: make(chan string, 64)}
	subscribed := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		_ = resp.Body.Close()
		<-done
	})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(resp.Body)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "retry:"): // written once subscribed
				close(subscribed)
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: ") && event == "rejection":
				var r struct {
					Resource string `json:"resource"`
				}
				if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &r) == nil {
					s.resources <- r.Resource
				}
			}
		}
	}()
	select {
	case <-subscribed:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not start")
	}
	return s
}

// next is the resource of the next rejection the stream hears.
func (s *rejectionStream) next(t *testing.T, what string) string {
	t.Helper()
	select {
	case r := <-s.resources:
		return r
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: no rejection on the stream", what)
		return ""
	}
}

// refuseWrite has base record a refused write (409 lease_released) on res.
func refuseWrite(t *testing.T, base, res string) {
	t.Helper()
	l, a := grant(base, res, "refused", time.Minute, 0)
	if a.code != http.StatusCreated {
		t.Fatalf("%s: acquire %s: %v", base, res, a)
	}
	if a := release(base, l.LeaseID); a.code != http.StatusNoContent {
		t.Fatalf("%s: release %s: %v", base, res, a)
	}
	want409(t, "write under a released lease", fencedWrite(base, l.LeaseID, "/"+res, "refused"), "lease_released")
}

func TestDeploymentsShareNothingInRedis(t *testing.T) {
	pgtest.Require(t)
	redisURL, rdb := sharedRedis(t)
	s1, s2 := pgtest.NewSchema(t), pgtest.NewSchema(t)
	up := newUpstream(t)
	deploy := func(schema string) *proc {
		return startProc(t, "--log-level", "warn", "--postgres", pgtest.URL(), "--pg-schema", schema, "--redis", redisURL,
			"--upstream", "svc="+up.URL)
	}
	d1, d2 := deploy(s1), deploy(s2)
	b1, b2 := d1.url(), d2.url()
	ctx := context.Background()
	// Names of this run only: under the default prefix (a broken build)
	// they must not meet an earlier run's claims.
	tag := s1[len(s1)-6:]
	x, y := "shared:x:"+tag, "shared:y:"+tag

	// Leases, both ways: the same name is granted in each deployment, and
	// each claim is under its own schema's prefix.
	for _, c := range []struct{ first, second, res string }{{b1, b2, x}, {b2, b1, y}} {
		l1, a := grant(c.first, c.res, "first", time.Minute, 0)
		if a.code != http.StatusCreated {
			t.Fatalf("%s: first acquire: %v", c.res, a)
		}
		l2, a := grant(c.second, c.res, "second", time.Minute, 0)
		if a.code != http.StatusCreated {
			t.Fatalf("%s: the other deployment's acquire of the same name: %v, want 201", c.res, a)
		}
		for _, w := range []struct {
			base, lease string
		}{{c.first, l1.LeaseID}, {c.second, l2.LeaseID}} {
			if a := fencedWrite(w.base, w.lease, "/"+c.res, c.res); a.code != http.StatusOK {
				t.Errorf("%s: write under each deployment's own lease: %v", c.res, a)
			}
		}
	}
	for _, s := range []string{s1, s2} {
		key := redis.SchemaPrefix(s) + "lease:" + x
		if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 1 {
			t.Errorf("the claim of %s in schema %s: %s exists %d, %v", x, s, key, n, err)
		}
	}

	// The live rejection stream, both ways: each stream's next rejection is
	// its own deployment's, never the other's (a Redis subscriber hears a
	// channel's messages in the order Redis publishes them, so another
	// deployment's rejection, published before, would come first).
	r1, r2 := openRejectionStream(t, b1), openRejectionStream(t, b2)
	steps := []struct {
		base   string
		stream *rejectionStream
		res    string
	}{
		{b2, r2, "rej:2a:" + tag}, // d2's subscription is live
		{b1, r1, "rej:1a:" + tag}, // d1's is; d2's rejection did not reach it
		{b2, r2, "rej:2b:" + tag}, // d1's did not reach d2
		{b1, r1, "rej:1b:" + tag}, // d2's did not reach d1
	}
	for _, s := range steps {
		refuseWrite(t, s.base, s.res)
		if got := s.stream.next(t, s.res); got != s.res {
			t.Errorf("after %s, the stream of its deployment heard %s first: rejections cross deployments", s.res, got)
		}
	}

	// Fences: a write in flight on d1 does not hold up d2's grant of the
	// same name (fences and their notifications are per schema).
	held, a := grant(b1, "fence:z:"+tag, "held", time.Minute, 0)
	if a.code != http.StatusCreated {
		t.Fatal(a)
	}
	inflight := make(chan answer, 1)
	go func() { inflight <- fencedWrite(b1, held.LeaseID, "/hold/z", "held write") }()
	<-up.entered
	if _, a := grant(b2, "fence:z:"+tag, "other", time.Minute, 0); a.code != http.StatusCreated {
		t.Errorf("d2's grant while d1 has a write in flight on the same name: %v, want 201 at once", a)
	}
	up.Release()
	if a := <-inflight; a.code != http.StatusOK {
		t.Errorf("d1's held write: %v", a)
	}
}

// --redis-prefix (here from the environment) overrides the schema's prefix.
func TestRedisPrefixFlag(t *testing.T) {
	pgtest.Require(t)
	redisURL, rdb := sharedRedis(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "fencegw-test-" + hex.EncodeToString(b[:]) + ":"
	up := newUpstream(t)
	p := startProcEnv(t, []string{"FENCEGW_REDIS_PREFIX=" + prefix}, "--log-level", "warn",
		"--postgres", pgtest.URL(), "--pg-schema", pgtest.NewSchema(t), "--redis", redisURL, "--upstream", "svc="+up.URL)
	if _, a := grant(p.url(), "named", "h", time.Minute, 0); a.code != http.StatusCreated {
		t.Fatal(a)
	}
	if n, err := rdb.Exists(context.Background(), prefix+"lease:named").Result(); err != nil || n != 1 {
		t.Errorf("%slease:named exists %d, %v", prefix, n, err)
	}
}
