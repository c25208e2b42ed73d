package torture

import (
	"context"
	"time"
)

// FaultPartitionRedis cuts, with a silent drop, the network between one
// replica and Redis alone (the redis mode) for a few seconds while writes
// are in flight, then restores it: the replica still reaches PostgreSQL
// (its fences, the ledger) and is reached by workers, so it must fail
// closed for what needs a lease read while the other replicas grant what
// its holders' leases gave up. The same network namespace as
// FaultPartition (netns.go), with the same needs: root, ip(8), iptables(8),
// and Redis listening on the host's end of the veth (Redis.Bind). Not in
// the default faults.
const FaultPartitionRedis = "partition-redis"

// injectPartitionRedis injects FaultPartitionRedis; false if f is another
// fault.
func (n *nemesis) injectPartitionRedis(ctx context.Context, f *Fault) (bool, error) {
	if f.Kind != FaultPartitionRedis {
		return false, nil
	}
	if n.netns == nil || n.cfg.Mode != ModeRedis {
		return true, errNotApplicable
	}
	r := n.replicas[len(n.replicas)-1] // the one in the namespace
	if !r.Alive() {
		return true, errNotApplicable
	}
	// Cut drops the namespace's ports; for this fault only Redis's, and
	// the namespace's own list is put back (heal restores with it) once
	// the cut is restored, whatever ends the fault.
	all := n.netns.ports
	n.netns.ports = []string{urlPort(n.cfg.Redis, "6379")}
	defer func() { n.netns.ports = all }()
	if err := n.netns.Cut(ctx); err != nil {
		return true, err
	}
	// Past the leases the cut replica's workers hold and a drain period,
	// so that other replicas grant them meanwhile.
	sleep(ctx, n.between(n.cfg.TTL+n.cfg.DrainPeriod+time.Second, n.cfg.TTL+n.cfg.DrainPeriod+3*time.Second))
	return true, n.netns.Restore(context.WithoutCancel(ctx))
}
