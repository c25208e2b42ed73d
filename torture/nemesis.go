package torture

// The nemesis: which faults a run injects, when, and into what (processes,
// stores, network, disk), and how each is undone.

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// errNotApplicable: the fault cannot happen in this run (it is not counted).
var errNotApplicable = errors.New("fault not applicable")

// nemesis injects one fault at a time, cycling through cfg.Faults in a
// shuffled order so that every kind happens, and records each.
type nemesis struct {
	cfg      Config
	up       *Upstream
	replicas []*Replica
	workers  []*workerProc
	pg       *Postgres
	rd       *Redis
	dataDisk string    // the embedded store's small disk (disk-full), if mounted
	slowDisk *SlowDisk // the embedded store's stallable disk (stall-disk), if mounted
	// refusing is the embedded store's file on a disk that can refuse its
	// writes (store-refuses-drain), if mounted.
	refusing string
	netns    *netns // the partitioned replica's, nil without FaultPartition
	logf     func(format string, args ...any)
	rng      *rand.Rand
	faults   []Fault
}

// between returns a duration in [lo, hi).
func (n *nemesis) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(n.rng.Int64N(int64(hi-lo)))
}

// pastTTL is a pause long enough for leases to expire and be re-granted.
func (n *nemesis) pastTTL() time.Duration { return n.between(2*n.cfg.TTL, 5*n.cfg.TTL) }

func (n *nemesis) run(ctx context.Context) {
	var queue []string
	sleep(ctx, n.cfg.FaultGap/2) // let the workers get going
	for ctx.Err() == nil {
		if len(queue) == 0 {
			queue = append([]string(nil), n.cfg.Faults...)
			n.rng.Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })
		}
		kind := queue[0]
		queue = queue[1:]
		// A fault that has begun runs to its end even if the run's time is
		// up: it always leaves every process and service running.
		f := Fault{Kind: kind, Start: now()}
		err := n.inject(context.WithoutCancel(ctx), &f)
		if errors.Is(err, errNotApplicable) {
			sleep(ctx, 50*time.Millisecond)
			continue
		}
		if err != nil {
			n.logf("fault %s failed: %v", kind, err)
			n.heal()
			continue
		}
		f.End = now()
		n.faults = append(n.faults, f)
		sleep(ctx, n.between(n.cfg.FaultGap/2, n.cfg.FaultGap))
	}
	n.heal()
}

// heal resumes everything and restarts what is down.
func (n *nemesis) heal() {
	n.up.Misbehave(Misbehaviour{})
	n.up.StopInWrite(nil)
	n.up.DelayNext(nil)
	if n.slowDisk != nil {
		if err := n.slowDisk.Resume(); err != nil {
			n.logf("resume the stalled disk: %v", err)
		}
	}
	for _, w := range n.workers {
		w.resume()
	}
	if n.netns != nil {
		if err := n.netns.Restore(context.Background()); err != nil {
			n.logf("restore the partitioned link: %v", err)
		}
	}
	for _, r := range n.replicas {
		r.Resume()
		if !r.Alive() {
			if err := r.Start(); err != nil {
				n.logf("restart gateway %d: %v", r.Index, err)
			}
		}
	}
}

func (n *nemesis) inject(ctx context.Context, f *Fault) error {
	cfg := n.cfg
	r := n.replicas[n.rng.IntN(len(n.replicas))]
	if ok, err := n.injectSessions(ctx, f, r); ok { // nemesis_sessions.go
		return err
	}
	if ok, err := n.injectPartitionRedis(ctx, f); ok { // nemesis_partition_redis.go
		return err
	}
	if ok, err := n.injectShutdownRedis(ctx, f, r); ok { // nemesis_shutdown_redis.go
		return err
	}
	if f.Kind == FaultStoreRefusesDrain { // nemesis_drain.go
		return n.storeRefusesDrain(ctx)
	}
	switch f.Kind {
	case FaultFailoverPostgres: // nemesis_failover.go
		return n.failover(ctx, f)
	case FaultDiskFull: // nemesis_disk.go
		return n.diskFull(ctx)
	case FaultStallDisk: // nemesis_disk.go
		return n.stallDisk(ctx)
	case FaultKillGateway:
		r.Kill()
		sleep(ctx, n.between(100*time.Millisecond, 500*time.Millisecond))
		return r.Start()
	case FaultPauseGateway:
		r.Pause()
		sleep(ctx, n.pastTTL())
		r.Resume()
	case FaultStopInWrite:
		stopped := make(chan *Replica, 1)
		n.up.StopInWrite(func(i int) {
			if i >= 0 && i < len(n.replicas) {
				n.replicas[i].Pause()
				stopped <- n.replicas[i]
			}
		})
		select {
		case r := <-stopped:
			sleep(ctx, n.pastTTL())
			r.Resume()
		case <-time.After(5 * time.Second):
			n.up.StopInWrite(nil)
			select { // armed a moment too late
			case r := <-stopped:
				r.Resume()
			case <-time.After(100 * time.Millisecond):
			}
		}
	case FaultKillInWrite:
		// The write is held at the upstream until its lease has expired
		// and a successor could have been granted, but not past the drain
		// period (a correct gateway is not blamed for a write that lands
		// after the bound it was configured with).
		hold := n.between(cfg.TTL+100*time.Millisecond, cfg.DrainPeriod-300*time.Millisecond)
		killed := make(chan *Replica, 1)
		n.up.StopInWrite(func(i int) {
			if i >= 0 && i < len(n.replicas) {
				n.replicas[i].Kill()
				killed <- n.replicas[i]
				time.Sleep(hold)
			}
		})
		select {
		case r := <-killed:
			sleep(ctx, hold+n.between(100*time.Millisecond, 300*time.Millisecond))
			return r.Start()
		case <-time.After(5 * time.Second):
			n.up.StopInWrite(nil)
			select { // armed a moment too late
			case r := <-killed:
				sleep(ctx, hold)
				return r.Start()
			case <-time.After(100 * time.Millisecond):
			}
		}
	case FaultPauseWorker:
		if len(n.workers) == 0 {
			return errNotApplicable // in-process workers stall by sleeping instead
		}
		w := n.workers[n.rng.IntN(len(n.workers))]
		w.pause()
		sleep(ctx, n.pastTTL())
		w.resume()
	case FaultSlowUpstream:
		// Delays past the forward timeout but short enough that the write
		// lands within the drain period the gateway starts at its timeout
		// (with 300ms to spare for a CPU-starved upstream).
		n.up.Misbehave(Misbehaviour{SlowPermille: 300, DelayMin: cfg.ForwardTimeout + 50*time.Millisecond,
			DelayMax: cfg.DrainPeriod - 300*time.Millisecond})
		sleep(ctx, n.between(time.Second, 2*time.Second))
		n.up.Misbehave(Misbehaviour{})
	case FaultDropUpstream:
		n.up.Misbehave(Misbehaviour{DropPermille: 200})
		sleep(ctx, n.between(500*time.Millisecond, 1500*time.Millisecond))
		n.up.Misbehave(Misbehaviour{})
	case FaultRestartPostgres, FaultRestartPostgresInWrite:
		if f.Kind == FaultRestartPostgresInWrite {
			// Every write from now on lands late; the gateway times out
			// while PostgreSQL is going down.
			n.up.Misbehave(Misbehaviour{SlowPermille: 1000, DelayMin: cfg.DrainPeriod - 400*time.Millisecond,
				DelayMax: cfg.DrainPeriod - 300*time.Millisecond})
			defer n.up.Misbehave(Misbehaviour{})
			sleep(ctx, cfg.ForwardTimeout/2)
		}
		if err := n.pg.Stop(ctx); err != nil {
			return err
		}
		f.DownFrom = now().Add(100 * time.Millisecond) // writes admitted just before may still be on the wire
		sleep(ctx, n.between(300*time.Millisecond, time.Second))
		f.DownTo = now()
		if err := n.pg.Start(ctx); err != nil {
			return err
		}
	case FaultRestartRedis:
		if err := n.rd.FlushAll(ctx); err != nil {
			return err
		}
		if err := n.rd.Shutdown(ctx); err != nil {
			return err
		}
		f.DownFrom = now().Add(100 * time.Millisecond)
		sleep(ctx, n.between(200*time.Millisecond, 700*time.Millisecond))
		f.DownTo = now()
		if err := n.rd.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}
