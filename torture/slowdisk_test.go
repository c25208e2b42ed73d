package torture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// requireSlowDisk skips without root or the tools, but fails under CI,
// which runs as root and must show a stalled disk.
func requireSlowDisk(t *testing.T) {
	t.Helper()
	if why := SlowDiskUnsupported(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI must show a stalled disk: %s", why)
		}
		t.Skip(why)
	}
}

type reply struct {
	status     int
	replayed   string // Idempotent-Replayed
	body       string
	code       string
	detail     string
	retryAfter string
	leaseID    string
	took       time.Duration
}

func post(t *testing.T, url string, body any) reply {
	t.Helper()
	b, _ := json.Marshal(body)
	return send(t, "POST", url, string(b), map[string]string{"Content-Type": "application/json"})
}

func send(t *testing.T, method, url, body string, header map[string]string) reply {
	t.Helper()
	start := time.Now()
	c := &http.Client{Timeout: time.Minute}
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil { // not Fatal: called from the test's goroutines too
		t.Errorf("%s %s: %v", method, url, err)
		return reply{detail: err.Error(), took: time.Since(start)}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out struct {
		Code    string `json:"code"`
		Detail  string `json:"detail"`
		LeaseID string `json:"lease_id"`
	}
	_ = json.Unmarshal(raw, &out)
	return reply{status: resp.StatusCode, code: out.Code, detail: out.Detail, retryAfter: resp.Header.Get("Retry-After"),
		leaseID: out.LeaseID, replayed: resp.Header.Get("Idempotent-Replayed"), body: string(raw), took: time.Since(start)}
}

// The real gateway on a real disk whose writes stall (SlowDisk): acquires
// and renewals reply 503 store_unavailable with Retry-After by their
// bound (wait_ms; --grant-wait for a renewal), not when the disk comes
// back, the log says why, and once the disk is back grants are made again
// by the same process. A fenced write's own records are bounded too: a
// keyed write's answer waits at most a second for its record (the disk
// stalls as it reaches the upstream), a keyed write that meets the stall
// at its begin is 503 store_unavailable by the forward timeout, and a
// stale write's 409 waits at most a second for its rejection's entry; a
// retry of the answered key is never forwarded again, and is replayed once
// the disk is back.
func TestStalledDiskAnswersStoreUnavailableInTime(t *testing.T) {
	requireSlowDisk(t)
	work := t.TempDir()
	bin := filepath.Join(work, "fencegw")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fencegw/fencegw/cmd/fencegw").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	disk, err := MountSlowDisk(work, filepath.Join(work, "data"), 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := disk.Close(); err != nil {
			t.Errorf("remove the slow disk: %v", err)
		}
	})
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	lw := &lockedWriter{w: &log}
	const grantWait, forwardTimeout = 2 * time.Second, 2 * time.Second
	var stallOnce sync.Once
	stallErr := make(chan error, 1)
	var keyedArrivals sync.Map // key -> *atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		n, _ := keyedArrivals.LoadOrStore(key, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		if key == `"answer"` { // the disk stalls as the write reaches the upstream
			stallOnce.Do(func() { stallErr <- disk.Stall() })
		}
		_, _ = io.WriteString(w, "applied "+key)
	}))
	t.Cleanup(up.Close)
	arrived := func(key string) int32 {
		n, ok := keyedArrivals.Load(`"` + key + `"`)
		if !ok {
			return 0
		}
		return n.(*atomic.Int32).Load()
	}
	r := &Replica{Addr: addr, bin: bin, log: lw, args: []string{"--data", disk.Dir, "--upstream", "u=http://127.0.0.1:9",
		"--upstream", "ok=" + up.URL, "--forward-timeout", forwardTimeout.String(),
		"--grant-wait", grantWait.String(), "--log-level", "warn", "--shutdown-delay", "0"}}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop) // before the disk goes
	// First of all (cleanups run last first): a process whose write the
	// disk holds cannot exit, so Stop would wait for ever on a stalled disk.
	t.Cleanup(func() { _ = disk.Resume() })
	if err := disk.Join(r.PID()); err != nil {
		t.Fatal(err)
	}
	acquire := func(res string, wait time.Duration) reply {
		return post(t, r.URL()+"/v1/leases", map[string]any{"resource": res, "holder": "h", "ttl_ms": 60_000, "wait_ms": wait.Milliseconds()})
	}
	held := acquire("held", 0)
	if held.status != http.StatusCreated {
		t.Fatalf("acquire on a healthy disk: %+v", held)
	}

	stale := acquire("stale", 0)
	if stale.status != http.StatusCreated {
		t.Fatalf("acquire on a healthy disk: %+v", stale)
	}
	if rel := send(t, "DELETE", r.URL()+"/v1/leases/"+stale.leaseID, "", nil); rel.status != http.StatusNoContent {
		t.Fatalf("release on a healthy disk: %+v", rel)
	}
	charge := func(lease, key string) reply {
		return send(t, "POST", r.URL()+"/v1/proxy/ok/charges", `{"amount":5}`, map[string]string{"Fencing-Lease": lease, "Idempotency-Key": `"` + key + `"`})
	}

	// The bound is the behaviour here: a stalled write is held for over an
	// hour, so an reply within the wait plus a generous margin can only
	// come from the gateway's own deadline.
	const wait, margin = 1500 * time.Millisecond, 5 * time.Second
	// A refusal's or an answer's wait for its record, and a margin short of
	// the 5 s these waited for before they were bounded.
	const recordWait, recordMargin = time.Second, 2500 * time.Millisecond
	answered := charge(held.leaseID, "answer")
	if err := <-stallErr; err != nil {
		t.Fatal(err)
	}
	if answered.status != http.StatusOK || answered.took > recordWait+recordMargin {
		t.Errorf("keyed write whose answer's record meets the stall: %+v; want 200 within %v (+%v)", answered, recordWait, recordMargin)
	}
	var wg sync.WaitGroup
	replies := make([]reply, 4)
	for i := range replies {
		wg.Go(func() { replies[i] = acquire(fmt.Sprint("stalled/", i), wait) })
	}
	wg.Wait()
	for i, a := range replies {
		if a.status != http.StatusServiceUnavailable || a.code != "store_unavailable" || a.retryAfter == "" {
			t.Errorf("acquire %d on a stalled disk: %+v; want 503 store_unavailable with Retry-After", i, a)
		}
		if a.took > wait+margin {
			t.Errorf("acquire %d answered after %v; want within its wait_ms %v (+%v)", i, a.took, wait, margin)
		}
	}
	renew := post(t, r.URL()+"/v1/leases/"+held.leaseID+"/renew", map[string]any{})
	if renew.status != http.StatusServiceUnavailable || renew.code != "store_unavailable" || renew.retryAfter == "" || renew.took > grantWait+margin {
		t.Errorf("renew on a stalled disk: %+v; want 503 store_unavailable with Retry-After within --grant-wait %v", renew, grantWait)
	}
	if !strings.Contains(replies[0].detail, "did not answer within") {
		t.Errorf("the reply does not say why: %q", replies[0].detail)
	}
	refused := send(t, "POST", r.URL()+"/v1/proxy/ok/x", "stale", map[string]string{"Fencing-Lease": stale.leaseID})
	if refused.status != http.StatusConflict || refused.code != "lease_released" || refused.took > recordWait+recordMargin {
		t.Errorf("stale write on a stalled disk: %+v; want 409 lease_released within %v (+%v)", refused, recordWait, recordMargin)
	}
	begun := charge(held.leaseID, "begin")
	if begun.status != http.StatusServiceUnavailable || begun.code != "store_unavailable" || begun.retryAfter == "" || begun.took > forwardTimeout+margin {
		t.Errorf("keyed write on a stalled disk: %+v; want 503 store_unavailable with Retry-After within --forward-timeout %v (+%v)", begun, forwardTimeout, margin)
	}
	retried := charge(held.leaseID, "answer")
	if retried.status != http.StatusServiceUnavailable && retried.status != http.StatusConflict || retried.took > forwardTimeout+margin {
		t.Errorf("retry of the answered key on a stalled disk: %+v; want 409 or 503 within --forward-timeout %v (+%v)", retried, forwardTimeout, margin)
	}
	if n, m := arrived("answer"), arrived("begin"); n != 1 || m != 0 {
		t.Errorf("on a stalled disk, the answered key reached the upstream %d times (want 1), the key that met the stall at its begin %d times (want 0)", n, m)
	}

	if err := disk.Resume(); err != nil {
		t.Fatal(err)
	}
	// Back: the same process grants again (the abandoned commits finish
	// first; a resource's next grant may wait for them).
	deadline := time.Now().Add(30 * time.Second)
	for {
		a := acquire("stalled/0", 5*time.Second)
		if a.status == http.StatusCreated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no grant after the disk came back: %+v", a)
		}
	}
	// The answer's record lands once the disk is back: a retry is
	// replayed, and the key was forwarded once.
	for {
		a := charge(held.leaseID, "answer")
		if a.status == http.StatusOK {
			if a.replayed != "true" {
				t.Errorf("retry of the answered key after the disk came back: %+v; want a replay", a)
			}
			break
		}
		if a.status != http.StatusConflict && a.status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("retry of the answered key after the disk came back: %+v", a)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := arrived("answer"); n != 1 {
		t.Errorf("the answered key reached the upstream %d times, want 1", n)
	}
	rej := send(t, "GET", r.URL()+"/v1/rejections?resource=stale", "", nil)
	if !strings.Contains(rej.body, `"lease_released"`) {
		t.Errorf("the stale write's rejection is not in the log after the disk came back: %s", rej.body)
	}
	r.Stop()
	lw.mu.Lock()
	out := log.String()
	lw.mu.Unlock()
	if !strings.Contains(out, "store call gave up waiting for the disk") {
		t.Errorf("the log does not name the stall:\n%s", out)
	}
	if !strings.Contains(out, "slow commit") {
		t.Errorf("the log does not name the slow commit:\n%s", out)
	}
	t.Logf("acquires on the stalled disk answered after %v, %v, %v, %v; renewal after %v; keyed write's answer %v, stale write %v, keyed begin %v",
		replies[0].took.Round(time.Millisecond), replies[1].took.Round(time.Millisecond), replies[2].took.Round(time.Millisecond),
		replies[3].took.Round(time.Millisecond), renew.took.Round(time.Millisecond), answered.took.Round(time.Millisecond),
		refused.took.Round(time.Millisecond), begun.took.Round(time.Millisecond))
}
