package torture

import "context"

// Netns is the partition fault's network namespace for use outside the
// torture (cmd/fencegw's fault tests): a namespace joined to the host by a
// veth pair, whose Cut drops, silently and both ways, the traffic to a set
// of the host's ports. Needs root, ip(8) and iptables(8); Remove removes
// what NewNetns made.
type Netns struct{ ns *netns }

// NewNetns creates the namespace; Cut drops the host's ports (none until
// SetPorts names them).
func NewNetns(ctx context.Context, ports []string) (*Netns, error) {
	ns, err := newNetns(ctx, ports)
	if err != nil {
		return nil, err
	}
	return &Netns{ns: ns}, nil
}

// SetPorts names the host's ports a Cut drops (call it while nothing is
// cut: Restore removes the rules of the ports named at the time).
func (n *Netns) SetPorts(ports ...string) { n.ns.ports = ports }

// HostIP is the host's address on the veth: how the namespace reaches the
// host (a service there must listen on it).
func (n *Netns) HostIP() string { return n.ns.hostIP }

// NamespaceIP is the namespace's address: where a process in it listens.
func (n *Netns) NamespaceIP() string { return n.ns.nsIP }

// Command wraps a command to run in the namespace (ip netns exec, which
// execs it: the process keeps the pid).
func (n *Netns) Command(name string, args ...string) (string, []string) {
	return n.ns.command(name, args...)
}

// Cut starts dropping the ports' traffic.
func (n *Netns) Cut(ctx context.Context) error { return n.ns.Cut(ctx) }

// Restore stops dropping it.
func (n *Netns) Restore(ctx context.Context) error { return n.ns.Restore(ctx) }

// Remove deletes the namespace and the veth pair.
func (n *Netns) Remove() { n.ns.remove() }
