package e2e

// A drain the store cannot record: the timed-out write's fence is held
// until the drain is recorded or has passed, in every storage mode.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/internal/refusingdisk"
	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// A's write reaches the upstream, which applies it only after the forward
// timed out. At the moment of the timeout the store refuses to record the
// drain, and takes writes again a moment later. A's 504 does not wait for
// the store; no grant of the resource returns before the drain period has
// passed from the timeout; and B's first write lands after A's. (Releasing
// the fence when the record failed let B be granted as soon as the store
// was back, and B's write landed before A's.)
//
// In the PostgreSQL modes a session of its own holds the resource's fences
// row FOR UPDATE (a long transaction, a migration): the drain's UPDATE
// waits, then fails on the statement timeout, and the row is free again a
// moment later. B asks on the other replica.
func TestStoreRefusesDrain(t *testing.T) {
	for _, redis := range []bool{false, true} {
		name := "postgres"
		if redis {
			name = "postgres-redis"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pgtest.Require(t)
			schema := pgtest.NewSchema(t)
			s := refusedDrain{
				forward: 300 * time.Millisecond,
				drain:   7 * time.Second,
				// Past the statement timeout that cuts the drain's
				// UPDATE short.
				refused: postgres.DefaultStatementTimeout + 800*time.Millisecond,
				refuse: func(t *testing.T, resource string) (func(), error) {
					return holdFenceRow(schema, resource)
				},
			}
			s.start = func(t *testing.T, ups map[string]string, o options) []*gw {
				var gws []*gw
				for i := range 2 {
					cfg := storagemode.Config{Schema: schema}
					if redis {
						requireRedis(t)
						cfg.Redis, cfg.RedisPrefix = redisURL(), fmt.Sprintf("fencegw-e2e:%s:", schema)
					}
					gws = append(gws, startWith(t, pgMode(t, cfg, i), ups, o))
				}
				return gws
			}
			s.run(t)
		})
	}
	// The embedded mode: the store's file refuses every write (made
	// immutable on an ext4 file system of the test's own, as root: each
	// write fails with EPERM, as a failing disk's would fail), then takes
	// them again.
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		dir := refusingdisk.Mount(t)
		s := refusedDrain{
			forward: 300 * time.Millisecond,
			drain:   3 * time.Second,
			refused: 800 * time.Millisecond,
			refuse: func(t *testing.T, _ string) (func(), error) {
				return refusingdisk.Refuse(t, filepath.Join(dir, "fencegw.db"))
			},
			start: func(t *testing.T, ups map[string]string, o options) []*gw {
				o.dir = dir
				return []*gw{startEmbedded(t, ups, o)}
			},
		}
		s.run(t)
	})
}

// refusedDrain is the story of TestStoreRefusesDrain in one mode.
type refusedDrain struct {
	forward, drain time.Duration
	// refused is how long, from the write's arrival, the store refuses.
	refused time.Duration
	// refuse makes the store refuse to record resource's drain until heal.
	refuse func(t *testing.T, resource string) (heal func(), err error)
	start  func(t *testing.T, ups map[string]string, o options) []*gw
}

func (s refusedDrain) run(t *testing.T) {
	const res = "refused-drain"
	// A's write lands before the drain started at its timeout ends.
	landsAfter := s.drain - 500*time.Millisecond
	up := newUpstream(t)
	refusing := make(chan error, 1)
	healed, aLanded := make(chan struct{}), make(chan struct{})
	var landed time.Time
	up.setHold(func(a arrival) {
		if a.Body != "A" {
			return
		}
		// Refused from before the forward times out, healed after.
		heal, err := s.refuse(t, res)
		refusing <- err
		if err == nil {
			go func() {
				time.Sleep(time.Until(a.At.Add(s.refused))) // the fault's length, not a wait for an event
				heal()
				close(healed)
			}()
		} else {
			close(healed)
		}
		time.Sleep(time.Until(a.At.Add(landsAfter)))
		landed = time.Now()
		close(aLanded)
	})
	o := options{forwardTimeout: s.forward, drainPeriod: s.drain, grantWait: 3 * s.drain}
	gws := s.start(t, map[string]string{"svc": up.URL}, o)
	other := gws[len(gws)-1]

	a := acquire(t, gws[0].URL, res, "A", 2*time.Second)
	sent := time.Now()
	got := write(t, gws[0].URL, "svc", "/x", a, "A")
	answered := time.Since(sent)
	if err := <-refusing; err != nil {
		t.Fatal(err)
	}
	wantProblem(t, got, http.StatusGatewayTimeout, "upstream_timeout")
	if answered >= postgres.DefaultStatementTimeout {
		t.Errorf("A's 504 came %v after its write was sent: it waited for the store", answered)
	}

	// B asks at once, and again as soon as the store is back, waiting as
	// long as it takes.
	var b answer
	for {
		b = do(t, "POST", other.URL+"/v1/leases", map[string]any{"resource": res, "holder": "B", "ttl_ms": 10000, "wait_ms": (3 * s.drain).Milliseconds()})
		if b.Status != http.StatusServiceUnavailable || b.Problem.Code != "store_unavailable" {
			break
		}
		<-healed // refused while the store was: once more, now that it is back
	}
	if b.Status != http.StatusCreated {
		t.Fatalf("B's acquire: %d %s", b.Status, b.Body)
	}
	var bl leaseJSON
	if err := json.Unmarshal(b.Body, &bl); err != nil {
		t.Fatal(err)
	}
	// The lease's grant time is the store's clock, on this host.
	granted := bl.ExpiresAt.Add(-time.Duration(bl.TTLms) * time.Millisecond)
	if earliest := sent.Add(s.forward + s.drain); granted.Before(earliest) {
		t.Errorf("B was granted %v before the drain period from A's timeout had passed", earliest.Sub(granted))
	}
	if w := write(t, other.URL, "svc", "/x", bl, "B"); w.Status != http.StatusOK {
		t.Fatalf("B's write: %d %s", w.Status, w.Body)
	}
	<-healed
	<-aLanded
	for _, ar := range up.seen() {
		if ar.Body == "B" && ar.At.Before(landed) {
			t.Errorf("B's write (token %d) arrived %v before A's older write (token %d) landed", bl.Token, landed.Sub(ar.At), a.Token)
		}
	}
}

// holdFenceRow takes resource's fences row FOR UPDATE on a connection of
// its own, as a long transaction would; heal lets it go.
func holdFenceRow(schema, resource string) (func(), error) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		var n int
		err = tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+pgx.Identifier{schema, "fences"}.Sanitize()+
			` WHERE resource = $1 FOR UPDATE) r`, resource).Scan(&n)
		if err == nil && n != 1 {
			err = fmt.Errorf("%d fences rows for %q", n, resource)
		}
	}
	if err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("lock the fences row: %w", err)
	}
	return func() {
		_ = tx.Rollback(ctx)
		_ = conn.Close(ctx)
	}, nil
}
