package torture

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// FaultRedisDownInShutdown stops Redis (FLUSHALL, shutdown nosave) while a
// replica is in its shutdown delay, with writes in flight, and starts it
// again: the replica must fail closed for what needs Redis, finish or fail
// its writes as any other outage would have them, and still exit within
// its delay and drain bound; the nemesis then starts it again. The redis
// mode only; not in the default faults. With it, every replica runs with
// a shutdown delay of shutdownRedisDelay instead of none.
const FaultRedisDownInShutdown = "redis-down-in-shutdown"

// shutdownRedisDelay is the replicas' --shutdown-delay under
// FaultRedisDownInShutdown: long enough for Redis to go down and come
// back within it.
const shutdownRedisDelay = 1500 * time.Millisecond

// terminate sends SIGTERM and returns the channel closed when the process
// exits (nil if it is not running).
func (r *Replica) terminate() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return nil
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	return r.exited
}

// injectShutdownRedis injects FaultRedisDownInShutdown; false if f is
// another fault.
func (n *nemesis) injectShutdownRedis(ctx context.Context, f *Fault, r *Replica) (bool, error) {
	if f.Kind != FaultRedisDownInShutdown {
		return false, nil
	}
	if n.rd == nil || n.cfg.Mode != ModeRedis || !r.Alive() {
		return true, errNotApplicable
	}
	exited := r.terminate()
	if exited == nil {
		return true, errNotApplicable
	}
	sleep(ctx, n.between(100*time.Millisecond, 300*time.Millisecond)) // into the delay
	if err := n.rd.FlushAll(ctx); err != nil {
		return true, err
	}
	if err := n.rd.Shutdown(ctx); err != nil {
		return true, err
	}
	f.DownFrom = now().Add(100 * time.Millisecond) // as restart-redis
	sleep(ctx, n.between(200*time.Millisecond, 700*time.Millisecond))
	f.DownTo = now()
	if err := n.rd.Start(ctx); err != nil {
		return true, err
	}
	// The delay, the drain of writes in flight (each bounded by the
	// forward timeout) and a margin.
	bound := shutdownRedisDelay + n.cfg.ForwardTimeout + 10*time.Second
	select {
	case <-exited:
	case <-time.After(bound):
		r.Kill()
		_ = r.Start()
		return true, fmt.Errorf("gateway %d did not exit %v after SIGTERM with Redis down in its shutdown delay", r.Index, bound)
	case <-ctx.Done():
		return true, ctx.Err()
	}
	r.Kill() // clears the exited process
	return true, r.Start()
}
