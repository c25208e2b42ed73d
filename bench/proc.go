package bench

// What a process costs, read from Linux's /proc: the CPU its threads (and
// its children's) have run, and its memory. The load tools read the
// servers they measure through these, so that each figure is taken one way.

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// GroupCPU sums the run time (/proc/PID/task/TID/schedstat, ns) of pid's
// threads and of its children's (one level: nginx's master and workers).
// It is 0 for a process that cannot be read.
func GroupCPU(pid int) time.Duration {
	total := taskCPU(pid)
	for _, child := range children(pid) {
		total += taskCPU(child)
	}
	return total
}

func taskCPU(pid int) time.Duration {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return 0
	}
	var total time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + t.Name() + "/schedstat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, _ := strconv.ParseInt(f[0], 10, 64)
		total += time.Duration(ns)
	}
	return total
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
	if err == nil {
		var out []int
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
		return out
	}
	// Without CONFIG_PROC_CHILDREN: scan /proc.
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
		s := string(st)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// SelfCPU is the CPU time (user and system) this process has used so far.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Memory is a process's memory as /proc/PID/status reports it, in KiB, by
// field name (VmRSS, RssAnon, RssFile, VmHWM, …).
type Memory map[string]int64

// ReadMemory reads pid's memory; an error if the process cannot be read.
func ReadMemory(pid int) (Memory, error) {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, err
	}
	kb := Memory{}
	for line := range strings.SplitSeq(string(st), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			kb[k], _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	return kb, nil
}

// MiB is field k in MiB.
func (m Memory) MiB(k string) float64 { return float64(m[k]) / 1024 }
