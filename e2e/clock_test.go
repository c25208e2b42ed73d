package e2e

// A worker whose clock is off: the gateway estimates each holder's offset
// from the Fencing-Client-Time of its acquires and renewals, exports it and
// shows it next to the holder.

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/client"
	"github.com/fencegw/fencegw/gateway"
)

// lyingClock is a Fencing-Client-Time value from a clock off by skew,
// after a previous round trip of rtt.
func lyingClock(skew, rtt time.Duration) string {
	v := time.Now().Add(skew).UTC().Format(time.RFC3339Nano)
	if rtt > 0 {
		v += fmt.Sprintf(";rtt=%d", rtt.Milliseconds())
	}
	return v
}

func TestClockSkewOfLyingClients(t *testing.T) {
	up := newUpstream(t)
	d := startDashboard(t, map[string]string{"up": up.URL})

	// Two workers that lie by 9 s either way, one on acquire, the other on
	// renew (with a round trip to correct for), and the SDK, honest.
	ahead := do(t, "POST", d.URL+"/v1/leases", map[string]any{"resource": "recon:1", "holder": "recon-ahead", "ttl_ms": 60000},
		gateway.HeaderClientTime, lyingClock(9*time.Second, 0))
	if ahead.Status != 201 {
		t.Fatalf("acquire with a clock: %d %s", ahead.Status, ahead.Body)
	}
	behind := acquire(t, d.URL, "recon:2", "recon-behind", time.Minute)
	// A round trip of 40 ms reported: the estimate adds 20 ms to the
	// client's time, as the request took about that long to arrive.
	if a := do(t, "POST", d.URL+"/v1/leases/"+behind.LeaseID+"/renew", map[string]any{},
		gateway.HeaderClientTime, lyingClock(-9*time.Second-20*time.Millisecond, 40*time.Millisecond)); a.Status != 200 {
		t.Fatalf("renew with a clock: %d %s", a.Status, a.Body)
	}
	c, err := client.New(d.URL, client.WithHolder("sdk-worker"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(context.Background(), "recon:3", client.AcquireOptions{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	// The SDK reports its clock with each call; wait until the gateway has
	// an estimate for it rather than for a guessed number of renewals.
	m := scrape(t, d.URL)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); m = scrape(t, d.URL) {
		if _, ok := m[`fencegw_holder_clock_offset_seconds{holder="sdk-worker"}`]; ok {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for holder, want := range map[string]float64{"recon-ahead": 9, "recon-behind": -9, "sdk-worker": 0} {
		got, ok := m[`fencegw_holder_clock_offset_seconds{holder="`+holder+`"}`]
		if !ok {
			t.Errorf("no clock offset for %s", holder)
			continue
		}
		// The estimate is off by the request's one-way delay at most:
		// loopback, under a loaded test machine. The bound is the
		// behaviour (an offset of 9 s is told from 0 and from -9), so it
		// is generous.
		if math.Abs(got-want) > 1 {
			t.Errorf("%s's clock offset = %.3f s, want %v ± 1", holder, got, want)
		}
		t.Logf("%s: estimated offset %+.3f s (lies by %+v s)", holder, got, want)
	}

	// The dashboard shows it next to the holder.
	a := do(t, "GET", d.URL+"/ui/", nil)
	page := string(a.Body)
	for _, want := range []string{`<td>recon-ahead</td>`, `class="n clock bad">&#43;9.0 s ahead`, `class="n clock bad">-9.0 s behind`, `class="n clock">`} {
		if !strings.Contains(page, want) {
			t.Errorf("overview lacks %q:\n%s", want, page[strings.Index(page, `id="leases"`):][:1500])
		}
	}

	// A malformed clock is the client's fault, and names the header.
	bad := do(t, "POST", d.URL+"/v1/leases", map[string]any{"resource": "recon:4", "holder": "x", "ttl_ms": 1000},
		gateway.HeaderClientTime, "yesterday")
	wantProblem(t, bad, 400, "invalid_request")
	if !strings.Contains(string(bad.Body), gateway.HeaderClientTime) {
		t.Errorf("the problem does not name %s: %s", gateway.HeaderClientTime, bad.Body)
	}
	if a := do(t, "POST", d.URL+"/v1/leases/"+behind.LeaseID+"/renew", map[string]any{},
		gateway.HeaderClientTime, lyingClock(0, 0)+";rtt=-3"); a.Status != 400 {
		t.Errorf("negative rtt: %d, want 400", a.Status)
	}
}
