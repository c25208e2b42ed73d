package torture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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
	code       string
	detail     string
	retryAfter string
	leaseID    string
	took       time.Duration
}

func post(t *testing.T, url string, body any) reply {
	t.Helper()
	b, _ := json.Marshal(body)
	start := time.Now()
	c := &http.Client{Timeout: time.Minute}
	resp, err := c.Post(url, "application/json", bytes.NewReader(b))
	if err != nil { // not Fatal: called from the test's goroutines too
		t.Errorf("POST %s: %v", url, err)
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
		leaseID: out.LeaseID, took: time.Since(start)}
}

// The real gateway on a real disk whose writes stall (SlowDisk): acquires
// and renewals reply 503 store_unavailable with Retry-After by their
// bound (wait_ms; --grant-wait for a renewal), not when the disk comes
// back, the log says why, and once the disk is back grants are made again
// by the same process.
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
	const grantWait = 2 * time.Second
	r := &Replica{Addr: addr, bin: bin, log: lw, args: []string{"--data", disk.Dir, "--upstream", "u=http://127.0.0.1:9",
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

	if err := disk.Stall(); err != nil {
		t.Fatal(err)
	}
	// The bound is the behaviour here: a stalled write is held for over an
	// hour, so an reply within the wait plus a generous margin can only
	// come from the gateway's own deadline.
	const wait, margin = 1500 * time.Millisecond, 5 * time.Second
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
	t.Logf("acquires on the stalled disk answered after %v, %v, %v, %v; renewal after %v",
		replies[0].took.Round(time.Millisecond), replies[1].took.Round(time.Millisecond), replies[2].took.Round(time.Millisecond),
		replies[3].took.Round(time.Millisecond), renew.took.Round(time.Millisecond))
}
