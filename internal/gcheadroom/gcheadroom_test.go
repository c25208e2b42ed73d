package gcheadroom

import (
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
		if got := Percent(c.live, c.roots, c.headroom); got != c.want {
			t.Errorf("Percent(%d, %d, %d) = %d, want %d", c.live, c.roots, c.headroom, got, c.want)
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

	stop := Start(128 << 20)
	runtime.GC() // the first cycle the tuner sees
	waitForGoal(t, 128<<20)
	with := churn(total)
	stop()
	if prev := debug.SetGCPercent(basePercent); prev != basePercent {
		t.Errorf("GOGC after stop = %d, want %d", prev, basePercent)
	}
	t.Logf("collections for %d MiB of garbage: %d without a headroom, %d with 128 MiB", total>>20, without, with)
	if with == 0 || with > total/(128<<20)+2 {
		t.Errorf("%d collections with a 128 MiB headroom for %d MiB of garbage, want 1 to %d", with, total>>20, total/(128<<20)+2)
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
