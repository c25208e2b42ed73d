// Package gcheadroom gives the garbage collector a fixed headroom above the
// live heap, so that a process whose live heap is small does not collect
// many times a second.
//
// Go's collector starts a cycle when the heap has grown by GOGC percent of
// what the last cycle found live, and no sooner than at 4 MB. A gateway's
// live heap is a few megabytes until it has granted many resources, while
// every request leaves a kilobyte or two of garbage: at 20,000 writes a
// second that is about ten cycles a second, each one scanning the stacks
// and globals afresh, and the collector took 2 µs of CPU per write
// (docs/benchmarks.md). With a headroom H, a cycle starts once the heap
// has grown by the live heap plus H: the goal is 2×live + H, where Go's
// default (GOGC=100) is 2×live. The growth per live byte is Go's, so what
// memory grows by per resource is unchanged; the process holds at most H
// more, whatever its size.
//
// The headroom is kept by setting GOGC after each cycle from the live heap
// that cycle found (debug.SetGCPercent, which takes effect at once, no
// stop of the world). GOGC and GOMEMLIMIT keep their meaning: a memory
// limit still bounds the heap, and a process started with GOGC set is left
// to it (Start does nothing), as an operator who set it expects.
package gcheadroom

import (
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Default is the headroom fencegw runs with unless told otherwise: at most
// 32 MiB more memory (less under a memory limit: Start), for about one
// collection a second at 20,000 writes a second instead of ten.
const Default = 32 << 20

// basePercent is GOGC's default, which the headroom is added to.
const basePercent = 100

// maxPercent bounds the percent set (the goal of a tiny heap with a huge
// headroom).
const maxPercent = 1_000_000

// heapMinimum is Go's least goal at GOGC=100 (runtime.defaultHeapMinimum);
// the runtime scales it with GOGC, so a high GOGC raises it too.
const heapMinimum = 4 << 20

// The heap the last cycle marked live, and the roots it scanned (stacks
// and globals), which Go's goal grows by GOGC percent of too.
var sampleNames = []string{"/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes"}

// percent is the GOGC that puts the goal of a heap with live bytes live,
// and roots bytes of stacks and globals, at 2×live + headroom. Go's goal is
// the larger of two terms, live + (live+roots)×GOGC/100 and
// heapMinimum×GOGC/100: of the two percents that bring one of them to
// that goal, the smaller keeps the other term at or below it (never less
// than Go's own 100, never more than maxPercent).
func percent(live, roots, headroom uint64) int {
	if headroom == 0 {
		return basePercent
	}
	if headroom >= 1<<50 {
		return maxPercent
	}
	goal := 2*live + headroom
	p := min(goal*100/heapMinimum, (live+headroom)*100/max(live+roots, 1))
	return int(min(max(p, basePercent), maxPercent))
}

// tuner sets GOGC after each collection; one per process at a time.
type tuner struct {
	headroom uint64
	sample   []metrics.Sample
	mu       sync.Mutex // one tune at a time (a stop racing a cycle)
	stopped  bool       // under mu
}

var running atomic.Pointer[tuner]

// limitShare: the headroom takes at most this part of the process's memory
// limit, so that a replica in a small container is not pushed towards it.
const limitShare = 8

// Capped is headroom, but at most an eighth of limit (0: none known).
func Capped(headroom, limit int64) int64 {
	if limit > 0 {
		return min(headroom, limit/limitShare)
	}
	return headroom
}

// Start keeps headroom bytes of headroom above the live heap from the next
// collection on, until stop is called (which puts GOGC back to 100). The
// headroom is at most an eighth of the process's memory limit, the least
// of GOMEMLIMIT and its cgroup's (MemoryLimit). It does nothing with
// headroom 0, when GOGC is set in the environment (the operator's choice
// wins), or when a headroom is already kept (the first one stays).
func Start(headroom int64) (stop func()) {
	headroom = Capped(headroom, MemoryLimit())
	if headroom <= 0 || os.Getenv("GOGC") != "" {
		return func() {}
	}
	t := &tuner{headroom: uint64(headroom), sample: make([]metrics.Sample, len(sampleNames))}
	for i, name := range sampleNames {
		t.sample[i].Name = name
	}
	if !running.CompareAndSwap(nil, t) {
		return func() {}
	}
	t.arm()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.stopped {
			return
		}
		t.stopped = true
		debug.SetGCPercent(basePercent)
		running.CompareAndSwap(t, nil)
	}
}

// sentinel is garbage whose finalizer runs after the cycle that found it
// unreachable: the tuner's hook into every collection. (Large enough not
// to share a block of the tiny allocator, whose blocks die together.)
type sentinel struct{ _ [32]byte }

func (t *tuner) arm() {
	runtime.SetFinalizer(new(sentinel), func(*sentinel) {
		if t.tune() {
			t.arm()
		}
	})
}

// tune sets GOGC for the live heap the last cycle found; false once stopped.
func (t *tuner) tune() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	metrics.Read(t.sample)
	var v [3]uint64
	for i, s := range t.sample {
		if s.Value.Kind() != metrics.KindUint64 {
			return true // not in this runtime: leave GOGC as it is
		}
		v[i] = s.Value.Uint64()
	}
	debug.SetGCPercent(percent(v[0], v[1]+v[2], t.headroom))
	return true
}

// MemoryLimit is the least of the process's memory limits that are set:
// GOMEMLIMIT (or debug.SetMemoryLimit) and its cgroup's (cgroup v2's
// memory.max, v1's memory.limit_in_bytes); 0 if none is.
func MemoryLimit() int64 {
	limit := cgroupLimit("/sys/fs/cgroup", "/proc/self/cgroup")
	if l := debug.SetMemoryLimit(-1); l > 0 && l < math.MaxInt64 && (limit == 0 || l < limit) {
		limit = l
	}
	return limit
}

// noLimit is what cgroup v1 reports for no limit (a page-rounded
// MaxInt64) and above: no container has 2^62 bytes.
const noLimit = 1 << 62

// cgroupLimit reads the memory limit of the process's cgroup under root
// (the cgroup file system), by its path in self (/proc/self/cgroup): the
// least limit of that cgroup and of those above it, as a parent's limit
// bounds its children (where the path is not mounted, as in a cgroup
// namespace, root's own is read); 0 if there is none, or none can be read.
func cgroupLimit(root, self string) int64 {
	b, _ := os.ReadFile(self)
	v1, v2 := "/", "/" // the process's cgroup paths
	for line := range strings.SplitSeq(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			v1 = parts[2]
		}
	}
	var limit int64
	for _, c := range []struct{ dir, path, file string }{
		{root, v2, "memory.max"},
		{filepath.Join(root, "memory"), v1, "memory.limit_in_bytes"},
	} {
		for p := filepath.Clean("/" + c.path); ; p = filepath.Dir(p) {
			if n := readLimit(filepath.Join(c.dir, p, c.file)); n > 0 && (limit == 0 || n < limit) {
				limit = n
			}
			if p == "/" {
				break
			}
		}
	}
	return limit
}

// readLimit is the limit a cgroup's memory.max or memory.limit_in_bytes
// holds; 0 for none ("max", v1's huge number) or a file that cannot be read.
func readLimit(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n <= 0 || n >= noLimit {
		return 0 // "max", or no limit
	}
	return n
}
