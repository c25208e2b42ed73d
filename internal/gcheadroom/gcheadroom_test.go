package gcheadroom

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, roots, headroom uint64
		want                  int
	}{
		// A small heap: Go's least goal, scaled by the percent, reaches it.
		{1 * mib, 0, 32 * mib, 850},         // 4 MiB × 8.5 = 34 MiB = 2 × 1 + 32
		{1 * mib, 1 * mib, 32 * mib, 850},   // the roots do not matter there
		{32 * mib, 0, 32 * mib, 200},        // 32 + 32 × 2 = 96 MiB
		{32 * mib, 32 * mib, 32 * mib, 100}, // 32 + 64 × 1 = 96 MiB
		{64 * mib, 0, 32 * mib, 150},        // 64 + 64 × 1.5 = 160 MiB
		{1 << 40, 0, 32 * mib, 100},         // a huge live heap: Go's own 100
		{5 * mib, 0, 0, 100},                // no headroom: Go's own 100
		{0, 0, 32 * mib, 800},               // 4 MiB × 8 = 32 MiB
		{1 * mib, 0, 1 << 49, maxPercent},   // a huge headroom: bounded
		{1 * mib, 0, 1 << 62, maxPercent},   // no overflow
		{1 * mib, 0, 1 * mib, basePercent},  // never below Go's own 100
	} {
		if got := percent(c.live, c.roots, c.headroom); got != c.want {
			t.Errorf("percent(%d, %d, %d) = %d, want %d", c.live, c.roots, c.headroom, got, c.want)
		}
	}
}

var sink []byte

// churn allocates total bytes of short-lived garbage and returns the
// collections that ran meanwhile.
func churn(total int) uint32 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range total / 4096 {
		sink = make([]byte, 4096)
	}
	runtime.ReadMemStats(&after)
	return after.NumGC - before.NumGC
}

// With a headroom, garbage is collected once per headroom's worth, not
// once per 4 MB (Go's floor with a small live heap); without, as Go does.
func TestHeadroomSpacesCollections(t *testing.T) {
	t.Setenv("GOGC", "")
	const total = 512 << 20
	runtime.GC()
	without := churn(total)

	// 128 MiB, or an eighth of this machine's memory limit if less.
	headroom := Capped(128<<20, MemoryLimit())
	stop := Start(128 << 20)
	runtime.GC() // the first cycle the tuner sees
	waitForGoal(t, uint64(headroom))
	with := churn(total)
	stop()
	if prev := debug.SetGCPercent(basePercent); prev != basePercent {
		t.Errorf("GOGC after stop = %d, want %d", prev, basePercent)
	}
	most := uint32(total/headroom) + 2
	t.Logf("collections for %d MiB of garbage: %d without a headroom, %d with %d MiB", total>>20, without, with, headroom>>20)
	if with == 0 || with > most {
		t.Errorf("%d collections with a %d MiB headroom for %d MiB of garbage, want 1 to %d", with, headroom>>20, total>>20, most)
	}
	if without < 4*with {
		t.Errorf("%d collections without a headroom, %d with: the headroom did not space them", without, with)
	}
}

// waitForGoal waits until the heap's goal is headroom above twice the
// live heap (the finalizer that sets it runs after the cycle), and fails
// if it is not there within 10 s, or overshoots it.
func waitForGoal(t *testing.T, headroom uint64) {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}, {Name: sampleNames[0]}}
	for deadline := time.Now().Add(10 * time.Second); ; {
		metrics.Read(s)
		goal, live := s[0].Value.Uint64(), s[1].Value.Uint64()
		want := 2*live + headroom
		// The percent is whole: the goal may fall short by 1 % of it.
		if goal+want/100 >= want {
			if goal > want+want/100 {
				t.Fatalf("the heap's goal is %d with %d live, want 2×live + %d = %d", goal, live, headroom, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the heap's goal is %d with %d live, want 2×live + %d = %d", goal, live, headroom, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStartDoesNothingWhenGOGCIsSet(t *testing.T) {
	t.Setenv("GOGC", "100")
	stop := Start(128 << 20)
	defer stop()
	runtime.GC()
	runtime.GC()
	if running.Load() != nil {
		t.Fatal("a headroom is kept though GOGC is set")
	}
}

// The headroom takes at most an eighth of a memory limit.
func TestCapped(t *testing.T) {
	for _, c := range []struct{ headroom, limit, want int64 }{
		{32 << 20, 0, 32 << 20},
		{32 << 20, 1 << 30, 32 << 20},
		{32 << 20, 128 << 20, 16 << 20},
		{32 << 20, 256 << 20, 32 << 20},
		{0, 128 << 20, 0},
	} {
		if got := Capped(c.headroom, c.limit); got != c.want {
			t.Errorf("Capped(%d, %d) = %d, want %d", c.headroom, c.limit, got, c.want)
		}
	}
}

// The cgroup's limit is the least along the process's cgroup path, in
// cgroup v2 or v1, and none where the files say none or are missing.
func TestCgroupLimit(t *testing.T) {
	write := func(t *testing.T, path, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name  string
		self  string
		files map[string]string
		want  int64
	}{
		{"v2 leaf", "0::/pod/app\n", map[string]string{"pod/app/memory.max": "268435456\n", "pod/memory.max": "max\n", "memory.max": "max\n"}, 256 << 20},
		{"v2 parent", "0::/pod/app\n", map[string]string{"pod/app/memory.max": "max\n", "pod/memory.max": "134217728\n"}, 128 << 20},
		{"v2 none", "0::/pod/app\n", map[string]string{"pod/app/memory.max": "max\n"}, 0},
		{"v2 namespaced", "0::/\n", map[string]string{"memory.max": "536870912\n"}, 512 << 20},
		{"v1", "4:memory:/process_api/x\n1:cpu:/\n0::/\n", map[string]string{"memory/process_api/x/memory.limit_in_bytes": "1073741824\n", "memory/memory.limit_in_bytes": "9223372036854771712\n"}, 1 << 30},
		{"v1 none", "4:memory:/process_api/x\n0::/\n", map[string]string{"memory/process_api/x/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"v1 joined controllers", "3:cpu,memory:/a\n", map[string]string{"memory/a/memory.limit_in_bytes": "67108864\n"}, 64 << 20},
		{"nothing", "", nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			self := filepath.Join(root, "self-cgroup")
			write(t, self, c.self)
			for f, v := range c.files {
				write(t, filepath.Join(root, "fs", f), v)
			}
			if got := cgroupLimit(filepath.Join(root, "fs"), self); got != c.want {
				t.Errorf("cgroupLimit = %d, want %d", got, c.want)
			}
		})
	}
}
