package bolt

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// What an operator sees of a slow disk: the commit durations as a
// histogram (Collectors), and in the log, at most once per slowLogEvery,
// a commit that took longer than slowCommit and a caller that stopped
// waiting for one (each answered 503 store_unavailable).

// slowCommit is the commit duration logged as slow: a healthy disk commits
// in milliseconds, and every grant, renewal and release waits for it.
const slowCommit = time.Second

// slowLogEvery spaces the log lines of a stalled disk: thousands of
// callers may give up within a second.
const slowLogEvery = 10 * time.Second

type slowLog struct {
	commits prometheus.Histogram
	slow    spacedLine // slow commits
	waits   spacedLine // callers that gave up waiting for one
}

// spacedLine counts the events of one log line and says when the line is
// due: at most once per slowLogEvery, with the events since the last one.
type spacedLine struct {
	mu    sync.Mutex
	at    time.Time // last line
	since int       // events since it
}

// note counts an event; if the line is due, it returns the events it
// stands for.
func (s *spacedLine) note() (n int, due bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.since++
	now := time.Now()
	if now.Sub(s.at) < slowLogEvery {
		return 0, false
	}
	n = s.since
	s.at, s.since = now, 0
	return n, true
}

func newSlowLog() *slowLog {
	return &slowLog{commits: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "fencegw_store_commit_seconds",
		Help: "Duration of the embedded store's commits (one transaction and its fsyncs, shared by the grants, renewals, releases and records of a group commit).",
		// From a fast SSD's fsync to a stalled volume's.
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})}
}

// committed observes one commit and logs it if slow.
func (l *slowLog) committed(log *slog.Logger, d time.Duration, calls int, err error) {
	l.commits.Observe(d.Seconds())
	if d < slowCommit {
		return
	}
	n, due := l.slow.note()
	if !due {
		return
	}
	log.Warn("slow commit: the disk under the embedded store took this long to commit; grants, renewals and releases wait for it, and callers past their deadline answer 503 store_unavailable",
		"duration", d.Round(time.Millisecond), "calls", calls, "failed", err != nil, "slow_commits_since_last_line", n)
}

// gaveUp logs a caller that stopped waiting for its commit; running is how
// long the commit in flight had been running then (0: none was).
func (l *slowLog) gaveUp(log *slog.Logger, op string, running time.Duration) {
	n, due := l.waits.note()
	if !due {
		return
	}
	log.Warn("store call gave up waiting for the disk: answered 503 store_unavailable at its caller's deadline; the commit goes on",
		"op", op, "commit_running_for", running.Round(time.Millisecond), "gave_up_since_last_line", n)
}

// Collectors are the store's own metrics, for the gateway's registry.
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.slow.commits}
}
