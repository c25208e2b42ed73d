package torture

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// FaultPartition cuts, with a silent drop (packets lost, no RST), the
// network between one replica and its stores (PostgreSQL, and Redis in
// the redis mode) for a few seconds while writes are in flight, then
// restores it. That replica runs in a network namespace of its own, joined
// to the host by a veth pair; workers and the upstream still reach it, so
// it goes on receiving bodies it may no longer send. Not in the default
// faults: it needs root, ip(8) and iptables(8), and a PostgreSQL that
// accepts connections on the host's end of the veth (docs/reliability.md).
const FaultPartition = "partition"

// netns is the network namespace of the partitioned replica and the /30
// between it and the host.
type netns struct {
	name     string // ip netns name
	hostVeth string // the host's end; the namespace's end is nsVeth
	nsVeth   string
	hostIP   string // the host's address on the veth
	nsIP     string // the namespace's address
	ports    []string
}

// needsPartition reports whether the run injects FaultPartition or
// FaultPartitionRedis (nemesis_partition_redis.go).
func (c *Config) needsPartition() bool {
	for _, f := range c.Faults {
		if f == FaultPartition || f == FaultPartitionRedis {
			return true
		}
	}
	return false
}

// newNetns creates the namespace fgw-<pid> and a veth pair with addresses
// in 10.231.<n>.0/30 (host .1, namespace .2), addresses used only between
// the two on this machine. storePorts are the ports a cut drops. On error
// it removes what it made.
func newNetns(ctx context.Context, storePorts []string) (*netns, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the %s fault runs a replica in a network namespace: run the torture as root", FaultPartition)
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("the %s fault needs %s(8) (iproute2, iptables): %w", FaultPartition, tool, err)
		}
	}
	pid := os.Getpid()
	n := pid % 256
	ns := &netns{name: fmt.Sprintf("fgw-%d", pid), hostVeth: fmt.Sprintf("fgwh%d", pid), nsVeth: fmt.Sprintf("fgwn%d", pid),
		hostIP: fmt.Sprintf("10.231.%d.1", n), nsIP: fmt.Sprintf("10.231.%d.2", n), ports: storePorts}
	steps := [][]string{
		{"ip", "netns", "add", ns.name},
		{"ip", "link", "add", ns.hostVeth, "type", "veth", "peer", "name", ns.nsVeth},
		{"ip", "link", "set", ns.nsVeth, "netns", ns.name},
		{"ip", "addr", "add", ns.hostIP + "/30", "dev", ns.hostVeth},
		{"ip", "link", "set", ns.hostVeth, "up"},
		{"ip", "netns", "exec", ns.name, "ip", "addr", "add", ns.nsIP + "/30", "dev", ns.nsVeth},
		{"ip", "netns", "exec", ns.name, "ip", "link", "set", ns.nsVeth, "up"},
		{"ip", "netns", "exec", ns.name, "ip", "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if _, err := run(ctx, 10*time.Second, s[0], s[1:]...); err != nil {
			ns.remove()
			return nil, fmt.Errorf("set up the network namespace: %w", err)
		}
	}
	return ns, nil
}

// remove deletes the namespace (which deletes the veth pair) and, if the
// namespace was gone already, the host's end. It runs on every exit.
func (ns *netns) remove() {
	ctx := context.Background()
	_, _ = run(ctx, 10*time.Second, "ip", "netns", "del", ns.name)
	if _, err := net.InterfaceByName(ns.hostVeth); err == nil {
		_, _ = run(ctx, 10*time.Second, "ip", "link", "del", ns.hostVeth)
	}
}

// command wraps a command to run inside the namespace. ip netns exec
// execs it, so the process keeps the pid the nemesis signals.
func (ns *netns) command(name string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", ns.name, name}, args...)
}

// rehost returns rawURL with its host replaced by the host's veth address
// (the port kept): how the namespace reaches a service of the host.
func (ns *netns) rehost(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	u.Host = net.JoinHostPort(ns.hostIP, u.Port())
	return u.String(), nil
}

// rules are the iptables rules of a cut: the namespace drops, both ways,
// every packet of the store ports. A drop, not a reject: neither end
// learns anything until its own timeouts fire.
func (ns *netns) rules() [][]string {
	ports := strings.Join(ns.ports, ",")
	return [][]string{
		{"OUTPUT", "-d", ns.hostIP, "-p", "tcp", "-m", "multiport", "--dports", ports, "-j", "DROP"},
		{"INPUT", "-s", ns.hostIP, "-p", "tcp", "-m", "multiport", "--sports", ports, "-j", "DROP"},
	}
}

// Cut starts dropping the store traffic.
func (ns *netns) Cut(ctx context.Context) error {
	for _, r := range ns.rules() {
		name, args := ns.command("iptables", append([]string{"-I"}, r...)...)
		if _, err := run(ctx, 10*time.Second, name, args...); err != nil {
			_ = ns.Restore(ctx)
			return err
		}
	}
	return nil
}

// Restore stops dropping it; safe to call when nothing is cut. A rule
// that is still there afterwards is an error: the replica would stay cut.
func (ns *netns) Restore(ctx context.Context) error {
	var errs []error
	for _, r := range ns.rules() {
		del, delArgs := ns.command("iptables", append([]string{"-D"}, r...)...)
		for i := 0; i < 10; i++ { // -D deletes one copy
			if _, err := run(ctx, 10*time.Second, del, delArgs...); err != nil {
				break
			}
		}
		chk, chkArgs := ns.command("iptables", append([]string{"-C"}, r...)...)
		if _, err := run(ctx, 10*time.Second, chk, chkArgs...); err == nil {
			errs = append(errs, fmt.Errorf("iptables rule %v still in place in %s", r, ns.name))
		}
	}
	return errors.Join(errs...)
}

// urlPort is rawURL's port, def if it names none.
func urlPort(rawURL, def string) string {
	if u, err := url.Parse(rawURL); err == nil && u.Port() != "" {
		if _, err := strconv.Atoi(u.Port()); err == nil {
			return u.Port()
		}
	}
	return def
}

// partitionReplica moves r into a new network namespace: r then listens on
// the namespace's address and reaches PostgreSQL, Redis and the upstream
// by the host's veth address, which each must accept connections on.
func partitionReplica(ctx context.Context, cfg *Config, r *Replica, up *Upstream, rd *Redis) (*netns, error) {
	if cfg.Mode == ModeEmbedded {
		return nil, fmt.Errorf("the %s fault cuts a replica from its shared stores: use the postgres or redis mode", FaultPartition)
	}
	if cfg.Replicas < 2 {
		return nil, fmt.Errorf("the %s fault needs two replicas or more", FaultPartition)
	}
	if cfg.Mode != ModeRedis && slices.Contains(cfg.Faults, FaultPartitionRedis) {
		return nil, fmt.Errorf("the %s fault cuts a replica from Redis: use the redis mode", FaultPartitionRedis)
	}
	ports := []string{urlPort(cfg.Postgres, "5432")}
	if cfg.Mode == ModeRedis {
		ports = append(ports, urlPort(cfg.Redis, "6379"))
	}
	ns, err := newNetns(ctx, ports)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*netns, error) {
		ns.remove()
		return nil, err
	}
	for _, p := range ports {
		addr := net.JoinHostPort(ns.hostIP, p)
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return fail(fmt.Errorf("the %s fault: nothing accepts connections on %s, the host's end of the veth: PostgreSQL's listen_addresses (Redis's bind) must include it, with a pg_hba line for 10.231.0.0/16 (docs/reliability.md): %w",
				FaultPartition, addr, err))
		}
		_ = c.Close()
	}
	pgURL, err := ns.rehost(cfg.Postgres)
	if err != nil {
		return fail(err)
	}
	if err := (&Postgres{URL: pgURL}).ping(ctx); err != nil {
		return fail(fmt.Errorf("the %s fault: PostgreSQL refuses %s (a pg_hba line for 10.231.0.0/16?): %w", FaultPartition, pgURL, err))
	}
	upURL, err := up.ListenAlso(ns.hostIP)
	if err != nil {
		return fail(err)
	}
	replace := map[string]string{up.URL: upURL, cfg.Postgres: pgURL}
	if cfg.Mode == ModeRedis {
		if replace[cfg.Redis], err = ns.rehost(cfg.Redis); err != nil {
			return fail(err)
		}
		rd.Bind = ns.hostIP
	}
	args := make([]string, len(r.args))
	for i, a := range r.args {
		for from, to := range replace {
			a = strings.ReplaceAll(a, from, to)
		}
		args[i] = a
	}
	_, port, _ := net.SplitHostPort(r.Addr) // the namespace's ports are all free
	r.Addr, r.args, r.netns = net.JoinHostPort(ns.nsIP, port), args, ns
	return ns, nil
}
