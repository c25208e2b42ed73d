package torture

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Faults of a replica's store sessions and of slow clients (the PostgreSQL
// modes): what a replica that admitted a write must do when it can no
// longer prove its fence before sending the write's bytes.
const (
	// FaultKillPGSessions terminates one replica's lock sessions and
	// listener (pg_terminate_backend, as a failover, a network blip that
	// resets connections or an operator would) while writes are in
	// flight; the process lives on and reconnects.
	FaultKillPGSessions = "kill-pg-sessions"
	// FaultSlowBody is a workload, not an event: with it in the fault
	// list, some writes' bodies trickle in over seconds (WorkerConfig.
	// SlowBodyPermille), long enough for a replica's lost sessions to be
	// drained and the resource granted elsewhere before the body's end.
	FaultSlowBody = "slow-body"
	// FaultFreezeReplica SIGSTOPs a replica holding fences past the orphan
	// drain, half the time killing its sessions while it is stopped, then
	// SIGCONTs it: it must send nothing it can no longer prove it may
	// send, and hand its fences over once it runs again.
	FaultFreezeReplica = "freeze-replica"
)

// sessionFaults are the faults of this file, for the PostgreSQL modes.
var sessionFaults = []string{FaultKillPGSessions, FaultSlowBody, FaultFreezeReplica}

// partitionNoticed is how long PostgreSQL takes to drop the sessions of a
// replica cut by a silent drop, with the keepalive and user timeout
// settings docs/reliability.md gives its cluster (1 s idle, 1 s interval,
// 2 probes; 2 s user timeout), plus a margin.
const partitionNoticed = 4 * time.Second

// slowBodyPause is how long a slow body stops midway: past the TTL, the
// orphan drain (drain period plus the gateway's 1 s session check) and a
// grant, but within the workers' request timeout.
func (c *Config) slowBodyPause() (lo, hi time.Duration) {
	lo = c.TTL + c.DrainPeriod + time.Second + 300*time.Millisecond
	if c.needsPartition() {
		// A silent drop is noticed by PostgreSQL only when its keepalives
		// or user timeout give up (a few seconds: docs/reliability.md);
		// only then are the locks free to drain. (Pausing a drain period
		// and a second longer still caught the broken build less often:
		// docs/reliability.md.)
		lo += partitionNoticed
	}
	return lo, lo + time.Second
}

// injectSessions injects the faults of this file; false if f is not one.
func (n *nemesis) injectSessions(ctx context.Context, f *Fault, r *Replica) (bool, error) {
	switch f.Kind {
	case FaultKillPGSessions:
		if n.pg == nil {
			return true, errNotApplicable
		}
		return true, n.killSessions(ctx, r)
	case FaultSlowBody:
		return true, errNotApplicable // the workers' bodies do it
	case FaultPartition:
		if n.netns == nil {
			return true, errNotApplicable
		}
		r = n.replicas[len(n.replicas)-1] // the one in the namespace
		if !r.Alive() {
			return true, errNotApplicable
		}
		if err := n.netns.Cut(ctx); err != nil {
			return true, err
		}
		sleep(ctx, n.between(partitionNoticed+n.cfg.DrainPeriod+time.Second, partitionNoticed+n.cfg.DrainPeriod+3*time.Second))
		return true, n.netns.Restore(ctx)
	case FaultFreezeReplica:
		if n.pg == nil {
			return true, errNotApplicable
		}
		r.Pause()
		defer r.Resume()
		sleep(ctx, n.between(n.cfg.TTL, 2*n.cfg.TTL))
		if n.rng.IntN(2) == 0 {
			if err := n.killSessions(ctx, r); err != nil {
				return true, err
			}
		}
		sleep(ctx, n.between(n.cfg.DrainPeriod+time.Second, n.cfg.DrainPeriod+2*time.Second))
		return true, nil
	}
	return false, nil
}

// killSessions terminates r's fence sessions (lock sessions and listener:
// their application_name ends in the replica's pid, see
// storage/postgres FenceOptions.Replica).
func (n *nemesis) killSessions(ctx context.Context, r *Replica) error {
	pid := r.Pid()
	if pid == 0 {
		return errNotApplicable
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, n.pg.URL)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var killed int
	err = c.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name LIKE 'fencegw-fence %' AND application_name LIKE $1`, fmt.Sprintf("%%/%d", pid)).Scan(&killed)
	if err != nil {
		return err
	}
	if killed == 0 {
		return errNotApplicable
	}
	return nil
}

// Pid is the replica's process id, 0 if it is not running.
func (r *Replica) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
}
