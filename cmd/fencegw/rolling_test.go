package main

// Rolling restarts behind a real load balancer: Debian's HAProxy
// health-checks /readyz in front of three `fencegw serve` replicas on a
// private PostgreSQL (and, in the Redis mode, a private Redis), workers loop
// acquire, three writes, release through it, and each replica in turn gets
// SIGTERM and is started again once it has exited. Not one request may
// fail, and the recording upstream must see no stale write. SIGKILL of a
// replica may fail only the requests it had in flight.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// haproxy is a private HAProxy in front of the replicas.
type haproxy struct {
	addr   string
	socket string // the stats socket (show stat)
	cmd    *exec.Cmd
	out    *proc // only its output buffer
	exited chan struct{}
}

// listenIn returns a free port in [lo, hi) on 127.0.0.1.
func listenIn(t *testing.T, lo, hi int) int {
	t.Helper()
	for p := lo; p < hi; p++ {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err == nil {
			ln.Close()
			return p
		}
	}
	t.Fatalf("no free port in [%d, %d)", lo, hi)
	return 0
}

// startHAProxy balances round robin over backends with the settings a
// production load balancer would have: /readyz checked every 250 ms, out
// after one failure, in after two successes, connections that fail retried
// (on another server: redispatch). X-Served-By names the server that
// answered. A check may take up to 2 s (timeout check, as /readyz's own
// ping bound): without it HAProxy allows a check its interval, and a
// healthy replica on a loaded machine that answers one check late is out.
func startHAProxy(t *testing.T, backends []string) *haproxy {
	t.Helper()
	bin := requireBinary(t, "haproxy")
	dir := t.TempDir()
	h := &haproxy{addr: fmt.Sprintf("127.0.0.1:%d", listenIn(t, 18250, 18400)), socket: filepath.Join(dir, "stats.sock"), exited: make(chan struct{})}
	var servers strings.Builder
	for i, b := range backends {
		fmt.Fprintf(&servers, "  server g%d %s check inter 250ms fall 1 rise 2\n", i, b)
	}
	cfg := fmt.Sprintf(`global
  maxconn 2000
  stats socket %s mode 600 level admin
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 60s
  timeout check 2s
  retries 3
  option redispatch
frontend fe
  bind %s
  default_backend gw
backend gw
  balance roundrobin
  option httpchk GET /readyz
  http-response set-header X-Served-By %%s
%s`, h.socket, h.addr, servers.String())
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	h.out = &proc{}
	h.cmd = exec.Command(bin, "-db", "-f", path)
	h.cmd.Stdout, h.cmd.Stderr = h.out, h.out
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = h.cmd.Wait(); close(h.exited) }()
	t.Cleanup(func() {
		_ = h.cmd.Process.Kill()
		<-h.exited
		if t.Failed() {
			t.Logf("haproxy output:\n%s", h.out.output())
		}
	})
	return h
}

// status is HAProxy's view of each server (UP, DOWN, ...), by name.
func (h *haproxy) status() (map[string]string, error) {
	c, err := net.DialTimeout("unix", h.socket, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "show stat\n"); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	out := map[string]string{}
	col := -1
	for sc.Scan() {
		f := strings.Split(sc.Text(), ",")
		if strings.HasPrefix(sc.Text(), "# ") {
			f[0] = strings.TrimPrefix(f[0], "# ")
			col = slices.Index(f, "status")
			continue
		}
		if col >= 0 && len(f) > col && f[0] == "gw" && f[1] != "BACKEND" {
			out[f[1]] = f[col]
		}
	}
	return out, sc.Err()
}

// waitStatus waits until HAProxy reports server as want (UP, DOWN).
func (h *haproxy) waitStatus(t *testing.T, server, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := h.status()
		if err == nil && strings.HasPrefix(st[server], want) {
			return
		}
		select {
		case <-h.exited:
			t.Fatalf("haproxy exited:\n%s", h.out.output())
		case <-time.After(25 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy did not see %s %s (status %v, %v)", server, want, st, err)
		}
	}
}

// outcome is one request a worker sent through the load balancer.
type outcome struct {
	op         string
	start, end time.Time
	a          answer
	server     string // X-Served-By
}

func (o outcome) failed() bool {
	switch o.op {
	case "acquire":
		return o.a.err != nil || o.a.code != http.StatusCreated
	case "write":
		return o.a.err != nil || o.a.code != http.StatusOK
	case "release again": // after a release that failed: it may have been done
		return o.a.err != nil || (o.a.code != http.StatusNoContent && o.a.problemCode() != "lease_lost")
	default: // release
		return o.a.err != nil || o.a.code != http.StatusNoContent
	}
}

// lbWorkers loop acquire, three writes, release, each on its own resource
// (so that nothing but a fault can refuse them), through one keep-alive
// client, as services behind a load balancer do.
type lbWorkers struct {
	client *http.Client
	ledger *tokenLedger
	mu     sync.Mutex
	all    []outcome
}

func (lw *lbWorkers) do(op, method, url string, body []byte, header ...string) outcome {
	o := outcome{op: op, start: time.Now()}
	req, err := http.NewRequest(method, url, strings.NewReader(string(body)))
	if err != nil {
		o.a.err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := lw.client.Do(req)
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		o.a = answer{code: resp.StatusCode, header: resp.Header, body: b, err: rerr}
		o.server = resp.Header.Get("X-Served-By")
	} else {
		o.a.err = err
	}
	o.end = time.Now()
	lw.mu.Lock()
	lw.all = append(lw.all, o)
	lw.mu.Unlock()
	return o
}

// run starts the workers. A worker does what a careful one would after a
// failure: it releases again after a failed release, and after an acquire
// whose answer it never read it waits for that lease (ttl) to run out.
func (lw *lbWorkers) run(ctx context.Context, wg *sync.WaitGroup, base string, workers int, prefix string, ttl time.Duration) {
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := fmt.Sprintf("%s-%d", prefix, w)
			for i := 0; ctx.Err() == nil; i++ {
				body, _ := json.Marshal(map[string]any{"resource": res, "holder": fmt.Sprintf("w%d", w), "ttl_ms": ttl.Milliseconds(), "wait_ms": (ttl + 10*time.Second).Milliseconds()})
				o := lw.do("acquire", "POST", base+"/v1/leases", body)
				var l lease
				if o.failed() || json.Unmarshal(o.a.body, &l) != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				lw.ledger.add(res, l.Token)
				for k := range 3 {
					lw.do("write", "POST", base+"/v1/proxy/svc/"+res, fmt.Appendf(nil, "%s token %d write %d", res, l.Token, k), "Fencing-Lease", l.LeaseID)
				}
				op := "release"
				for range 5 {
					if !lw.do(op, "DELETE", base+"/v1/leases/"+l.LeaseID, nil).failed() {
						break
					}
					op = "release again"
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
}

func (lw *lbWorkers) outcomes() []outcome {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return slices.Clone(lw.all)
}

// summary counts outcomes by op and answer, for the log.
func summary(os []outcome) string {
	n := map[string]int{}
	for _, o := range os {
		k := o.op + " error"
		if o.a.err == nil {
			k = o.op + " " + strconv.Itoa(o.a.code) + " " + o.a.problemCode()
		}
		n[k]++
	}
	keys := make([]string, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-40s %d\n", k, n[k])
	}
	return b.String()
}

// lbCluster is replicas on fixed addresses behind HAProxy.
type lbCluster struct {
	lb    *haproxy
	addrs []string
	args  []string
	ps    []*proc
}

func startLBCluster(t *testing.T, n int, args ...string) *lbCluster {
	t.Helper()
	c := &lbCluster{args: args}
	for range n {
		c.addrs = append(c.addrs, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	}
	for i := range n {
		c.ps = append(c.ps, c.start(t, i))
	}
	c.lb = startHAProxy(t, c.addrs)
	for i := range n {
		c.lb.waitStatus(t, fmt.Sprintf("g%d", i), "UP")
	}
	return c
}

func (c *lbCluster) start(t *testing.T, i int) *proc {
	t.Helper()
	return startProc(t, append([]string{"--listen", c.addrs[i], "--log-level", "warn"}, c.args...)...)
}

// restart sends replica i SIGTERM, waits for it to exit 0, starts it again
// on the same address and waits until the load balancer has it back.
func (c *lbCluster) restart(t *testing.T, i int) {
	t.Helper()
	p := c.ps[i]
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("replica %d did not exit after SIGTERM:\n%s", i, p.output())
	}
	if p.err != nil {
		t.Fatalf("replica %d exited with %v:\n%s", i, p.err, p.output())
	}
	c.ps[i] = c.start(t, i)
	c.lb.waitStatus(t, fmt.Sprintf("g%d", i), "UP")
}

// checkUpstream: every write answered 200 reached the upstream once, in
// token order per resource (no stale write), with a token that was granted.
func checkUpstream(t *testing.T, up *recUpstream, lw *lbWorkers) {
	t.Helper()
	up.checkOrder(t)
	ok := 0
	for _, o := range lw.outcomes() {
		if o.op == "write" && !o.failed() {
			ok++
		}
	}
	got := up.deliveries()
	if len(got) < ok {
		t.Errorf("%d writes answered 200, the upstream received %d", ok, len(got))
	}
	lw.ledger.mu.Lock()
	defer lw.ledger.mu.Unlock()
	for _, d := range got {
		if !lw.ledger.seen[d.Resource][d.Token] {
			t.Errorf("the upstream received a write of %s with token %d, which no worker was granted", d.Resource, d.Token)
		}
	}
	for _, d := range lw.ledger.dups {
		t.Errorf("guarantee 3 violated: %s", d)
	}
}

func rollingModes(t *testing.T) []struct {
	name string
	args func(t *testing.T) []string
} {
	return []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"postgres", func(t *testing.T) []string { return []string{"--postgres", startPostgres(t).URL()} }},
		{"postgres+redis", func(t *testing.T) []string {
			return []string{"--postgres", startPostgres(t).URL(), "--redis", startRedis(t).URL()}
		}},
	}
}

// replicaArgs: a shutdown delay of four health-check intervals (the
// documented sizing: 250 ms × fall 1, plus a margin).
func replicaArgs(up *recUpstream) []string {
	return []string{"--upstream", "svc=" + up.URL, "--shutdown-delay", "1s",
		"--forward-timeout", "5s", "--drain-period", "1s", "--grant-wait", "10s"}
}

// Each of three replicas behind HAProxy gets SIGTERM in turn, twice over,
// under load: not one request fails, no stale write reaches the upstream,
// no token is granted twice.
func TestRollingRestartFailsNothing(t *testing.T) {
	for _, m := range rollingModes(t) {
		t.Run(m.name, func(t *testing.T) {
			up := newUpstream(t)
			c := startLBCluster(t, 3, append(m.args(t), replicaArgs(up)...)...)
			lw := &lbWorkers{client: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}, ledger: newTokenLedger()}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			lw.run(ctx, &wg, "http://"+c.lb.addr, 12, "roll", 30*time.Second)
			time.Sleep(500 * time.Millisecond) // load before the first restart
			for round := range 2 {
				for i := range c.ps {
					c.restart(t, i)
					t.Logf("round %d: replica %d restarted", round, i)
				}
			}
			time.Sleep(300 * time.Millisecond) // load after the last
			cancel()
			wg.Wait()
			all := lw.outcomes()
			t.Logf("%d requests through HAProxy:\n%s", len(all), summary(all))
			failed := 0
			for _, o := range all {
				if o.failed() {
					failed++
					if failed <= 10 {
						t.Errorf("failed request during the rolling restart: %s %v (server %q, at %s)", o.op, o.a, o.server, o.start.Format("15:04:05.000"))
					}
				}
			}
			if failed > 0 {
				t.Errorf("%d of %d requests failed", failed, len(all))
			}
			if len(all) < 100 {
				t.Errorf("void run: only %d requests", len(all))
			}
			checkUpstream(t, up, lw)
		})
	}
}

// SIGKILL of one replica behind HAProxy fails only the requests that replica
// had in flight when it died: every request sent after the kill succeeds
// (HAProxy retries refused connections on another server until its check
// takes the replica out).
func TestRollingKillFailsOnlyInFlight(t *testing.T) {
	up := newUpstream(t)
	c := startLBCluster(t, 3, append(rollingModes(t)[0].args(t), replicaArgs(up)...)...)
	lw := &lbWorkers{client: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}, ledger: newTokenLedger()}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Leases long enough for a loaded machine's slowest loop; an acquire
	// whose answer was lost holds its worker up for at most this long.
	lw.run(ctx, &wg, "http://"+c.lb.addr, 12, "kill", 10*time.Second)
	time.Sleep(time.Second)
	killAt := time.Now()
	if err := c.ps[1].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.ps[1].exited
	c.lb.waitStatus(t, "g1", "DOWN")
	// Until its check fails, HAProxy may still send a request on a
	// connection to the dead replica it had kept alive: that request is
	// in flight at the replica too, as far as its client can tell.
	downAt := time.Now()
	time.Sleep(4 * time.Second) // the survivors carry the load; orphaned fences drain
	cancel()
	wg.Wait()
	all := lw.outcomes()
	t.Logf("%d requests through HAProxy:\n%s", len(all), summary(all))
	failed := 0
	for _, o := range all {
		if !o.failed() {
			continue
		}
		failed++
		if !o.start.Before(downAt) || o.end.Before(killAt) || o.server != "" {
			t.Errorf("a request not sent to the replica before it was taken out failed: %s %v (server %q, %s..%s, kill at %s, out at %s)", o.op, o.a,
				o.server, o.start.Format("15:04:05.000"), o.end.Format("15:04:05.000"), killAt.Format("15:04:05.000"), downAt.Format("15:04:05.000"))
		}
	}
	if failed > 24 {
		t.Errorf("%d requests failed, more than the 12 workers can have sent to the killed replica (one in flight, one on a kept-alive connection)", failed)
	}
	t.Logf("%d requests failed, all sent to the killed replica before HAProxy took it out (%v after the kill)", failed, downAt.Sub(killAt).Round(time.Millisecond))
	checkUpstream(t, up, lw)
}
