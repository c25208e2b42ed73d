package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

// smallDisk mounts a tmpfs of size bytes (root only; CI runs as root) and
// unmounts it when the test ends.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "mounting a small tmpfs needs root")
	}
	requireBinary(t, "mount")
	dir, err := os.MkdirTemp("", "fencegw-disk-")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		os.Remove(dir)
		missing(t, fmt.Sprintf("mount tmpfs: %v %s", err, out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
		os.Remove(dir)
	})
	return dir
}

// fill writes zeros to path until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the disk: %v", err)
			}
			break
		}
	}
	// Whatever a smaller write still fits.
	for n := len(buf) / 2; n > 0; n /= 2 {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				break
			}
		}
	}
}

// The embedded store's disk fills up under the gateway. While it is full,
// grants, recorded refusals and keyed writes answer 503 store_unavailable
// with Retry-After and nothing is forwarded without its record; once space
// is back the same process serves again, and every token issued before
// still holds. The file is never corrupted.
func TestFullDiskEmbedded(t *testing.T) {
	disk := smallDisk(t, "4m")
	data := filepath.Join(disk, "data")
	up := newUpstream(t)
	args := []string{"--data", data, "--upstream", "svc=" + up.URL, "--drain-period", "300ms", "--log-level", "warn"}
	p := startProc(t, args...)
	base := p.url()

	// Before: a lease that is live across the fault, one superseded.
	old, a := grant(base, "keep", "old", time.Minute, 0)
	if a.code != http.StatusCreated {
		t.Fatalf("grant: %v", a)
	}
	if a := call("POST", base+"/v1/leases/"+old.LeaseID+"/revoke", nil); a.err != nil {
		t.Fatal(a.err)
	}
	live, a := grant(base, "keep", "live", 5*time.Minute, 5*time.Second)
	if a.code != http.StatusCreated {
		t.Fatalf("grant: %v", a)
	}
	before := map[string]int64{"keep": live.Token}
	for i := range 20 {
		res := fmt.Sprintf("before-%d", i)
		l, a := grant(base, res, "b", time.Minute, 0)
		if a.code != http.StatusCreated {
			t.Fatalf("grant: %v", a)
		}
		before[res] = l.Token
		release(base, l.LeaseID)
	}

	fill(t, filepath.Join(disk, "filler"))
	// The file has free pages of its own: grant on fresh resources until
	// bbolt needs to grow the file and cannot.
	var full answer
	granted := 0
	for i := 0; i < 100000; i++ {
		res := fmt.Sprintf("fill-%06d-%s", i, strings.Repeat("x", 100))
		l, a := grant(base, res, strings.Repeat("h", 120), time.Minute, 0)
		if a.code != http.StatusCreated {
			full = a
			break
		}
		release(base, l.LeaseID)
		if granted++; granted > 200 { // the last ones, granted as the disk filled
			delete(before, fmt.Sprintf("fill-%06d-%s", i-200, strings.Repeat("x", 100)))
		}
		before[res] = l.Token
	}
	t.Logf("%d grants after the disk filled, then %v", granted, full)
	want503(t, "grant on a full disk", full, "store_unavailable")

	// While full, a grant may still fit in pages a failed commit left
	// free; whatever is answered 201 is on disk (checked after restart).
	for i := range 20 {
		res := fmt.Sprintf("while-full-%d", i)
		l, a := grant(base, res, "n", time.Minute, 0)
		if a.code != http.StatusCreated {
			want503(t, "another grant on a full disk", a, "store_unavailable")
			continue
		}
		release(base, l.LeaseID)
		before[res] = l.Token
	}
	// A stale write's refusal must be recorded: fail closed.
	a = fencedWrite(base, old.LeaseID, "/keep", "stale while full")
	t.Logf("stale write on a full disk: %v", a)
	if a.code != http.StatusServiceUnavailable && a.code != http.StatusConflict {
		t.Errorf("stale write on a full disk: %v, want 503 store_unavailable (or 409 if its record fit)", a)
	}
	// A keyed write's record must be stored before it is forwarded.
	a = call("POST", base+"/v1/proxy/svc/keep", []byte("keyed while full"), "Fencing-Lease", live.LeaseID, "Idempotency-Key", `"full-1"`)
	if a.code == http.StatusOK {
		t.Logf("keyed write on a full disk went through: its record fit in a free page")
	} else {
		want503(t, "keyed write on a full disk", a, "store_unavailable")
		if up.received("keyed while full") {
			t.Error("a keyed write was forwarded without its record")
		}
	}
	if up.received("stale while full") {
		t.Error("a stale write reached the upstream")
	}

	// Space comes back: the same process serves again.
	if err := os.Remove(filepath.Join(disk, "filler")); err != nil {
		t.Fatal(err)
	}
	var after lease
	for deadline := time.Now().Add(30 * time.Second); ; {
		l, a := grant(base, "after-space", "a", time.Minute, 0)
		if a.code == http.StatusCreated {
			after = l
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no grant 30 s after space came back: %v\n%s", a, p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = after
	if w := fencedWrite(base, live.LeaseID, "/keep", "live after"); w.code != http.StatusOK {
		t.Errorf("the live lease after space came back: %v", w)
	}
	want409(t, "the superseded lease after space came back", fencedWrite(base, old.LeaseID, "/keep", "stale after"), "stale_token")
	checkTokensHold := func(base string) {
		t.Helper()
		for res, tok := range before {
			if res == "keep" {
				continue
			}
			l, a := grant(base, res, "c", time.Second, 30*time.Second)
			if a.code != http.StatusCreated {
				t.Errorf("grant on %s: %v", res, a)
				continue
			}
			if l.Token <= tok {
				t.Errorf("%s: token %d granted after %d", res, l.Token, tok)
			}
			before[res] = l.Token
			release(base, l.LeaseID)
		}
	}
	checkTokensHold(base)

	// Stopped and checked: the file is sound, and a new process keeps the
	// tokens and the live lease.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	if p.err != nil {
		t.Errorf("exit after the full disk: %v\n%s", p.err, p.output())
	}
	db, err := bbolt.Open(filepath.Join(data, "fencegw.db"), 0o600, &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Errorf("the bbolt file is corrupt after the full disk: %v", err)
	}
	db.Close()
	p2 := startProc(t, args...)
	if w := fencedWrite(p2.url(), live.LeaseID, "/keep", "live after restart"); w.code != http.StatusOK {
		t.Errorf("the live lease after restart: %v", w)
	}
	checkTokensHold(p2.url())
	up.checkOrder(t)
}
