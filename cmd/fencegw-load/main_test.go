package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/fencegw/fencegw/bench"
)

// TestMain lets the test binary stand in for the tool when -servers
// process starts it as a setup's server (startSelf runs os.Executable).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-serve" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestParseSetups(t *testing.T) {
	o, err := parseFlags([]string{"-setups", "direct,gateway,peers"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string{"direct", "gateway"}, installedPeers()...)
	if strings.Join(o.setups, ",") != strings.Join(want, ",") {
		t.Fatalf("setups %v, want %v", o.setups, want)
	}
	if _, err := parseFlags([]string{"-setups", "squid"}, &bytes.Buffer{}); err == nil {
		t.Fatal("an unknown setup was accepted")
	}
	if _, err := parseFlags([]string{"-gateway", "http://127.0.0.1:1", "-upstream-name", "x", "-setups", "gateway,nginx"}, &bytes.Buffer{}); err == nil && len(installedPeers()) > 0 {
		t.Fatal("a peer was accepted with -gateway (it needs the local upstream)")
	}
	o, err = parseFlags([]string{"-gateway", "http://127.0.0.1:1", "-upstream-name", "x", "-setups", "gateway,peers"}, &bytes.Buffer{})
	if err != nil || strings.Join(o.setups, ",") != "gateway" {
		t.Fatalf("with -gateway, peers should expand to nothing: %v %v", o.setups, err)
	}
	// fasthttp is run only when named, and a missing program says how
	// to build it.
	_, err = parseFlags([]string{"-setups", "fasthttp", "-fasthttp", filepath.Join(t.TempDir(), "none")}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), fasthttpBuild) || !strings.Contains(err.Error(), "-fasthttp /tmp/fasthttp-ceiling") {
		t.Fatalf("a missing -fasthttp program: %v", err)
	}
	if slices.Contains(installedPeers(), "fasthttp") {
		t.Fatal("fasthttp is one of peers")
	}
}

// buildFasthttp builds tools/fasthttp-ceiling (a module of its own) and
// returns the program's path.
func buildFasthttp(t *testing.T) string { return buildTool(t, "fasthttp-ceiling") }

// buildTool builds tools/NAME, a module of its own, and returns the
// program's path.
func buildTool(t *testing.T, name string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: the go command is required to build tools/%s (install the Go toolchain): %v", name, err)
		}
		t.Skipf("no go command to build tools/%s (%v); set CI=true to make this a failure", name, err)
	}
	bin := filepath.Join(t.TempDir(), name)
	cmd := exec.Command(goBin, "build", "-C", filepath.Join("..", "..", "tools", name), "-o", bin, ".")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build tools/%s: %v\n%s", name, err, out)
	}
	return bin
}

// The fasthttp setup, plain and over TLS, carries a write to the upstream
// with X-Forwarded-For and -Proto set, reports its CPU, and stop leaves
// no process of its group; a run measures it beside the bare proxy.
func TestFasthttpCeiling(t *testing.T) {
	bin := buildFasthttp(t)
	type seen struct{ forwardedFor, proto, body string }
	got := make(chan seen, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		select {
		case got <- seen{r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Forwarded-Proto"), string(b)}:
		default:
		}
		_, _ = w.Write(bench.UpstreamReply)
	}))
	defer up.Close()
	upURL, _ := url.Parse(up.URL)
	tt, err := newTestTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []*testTLS{nil, tt} {
		client := bench.NewClient(1)
		proto := "http"
		if tt != nil {
			client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: tt.pool}
			proto = "https"
		}
		p, err := startPeer(context.Background(), "fasthttp", bin, upURL, tt)
		if err != nil {
			t.Fatal(err)
		}
		reply, err := bench.Write(context.Background(), client, bench.Target{URL: p.url.String() + bench.WritePath}, []byte("hello"), 0)
		client.CloseIdleConnections()
		if err != nil || !bytes.Equal(reply, bench.UpstreamReply) {
			p.stop()
			t.Fatalf("%s: %q %v", proto, reply, err)
		}
		if s := <-got; s.forwardedFor != "127.0.0.1" || s.proto != proto || s.body != "hello" {
			t.Errorf("%s: the upstream got X-Forwarded-For %q, X-Forwarded-Proto %q, body %q", proto, s.forwardedFor, s.proto, s.body)
		}
		if p.cpu() <= 0 {
			t.Errorf("%s: no CPU time read from /proc", proto)
		}
		pgid := p.cmd.Process.Pid
		p.stop()
		if syscall.Kill(-pgid, 0) == nil {
			t.Fatalf("%s: processes of group %d are left after stop", proto, pgid)
		}
	}

	var out, errOut bytes.Buffer
	args := []string{"-servers", "inline", "-setups", "direct,bare-proxy,fasthttp", "-fasthttp", bin, "-duration", "300ms", "-rounds", "1", "-warmup", "0", "-concurrency", "2"}
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "fasthttp / bare-proxy: throughput") || !strings.Contains(out.String(), ", server CPU per request ") {
		t.Fatalf("no fasthttp ratio with its server CPU in\n%s", out.String())
	}
}

// peersInstall is how to install every peer (what .ci/run does).
const peersInstall = "apt-get install nginx-light haproxy caddy"

// peersFor returns the installed peers. Under CI=true every peer must be
// installed (.ci/run installs them): a missing one fails the test, saying
// what to install, rather than goes unmeasured.
func peersFor(t *testing.T) []string {
	t.Helper()
	peers := installedPeers()
	if os.Getenv("CI") == "true" && len(peers) != len(peerNames) {
		t.Fatalf("CI=true: %v must all be installed (%s); found %v", peerNames, peersInstall, peers)
	}
	return peers
}

// skipWithoutPeers skips a test of the peers when none is installed
// (never under CI=true: peersFor has failed it then).
func skipWithoutPeers(t *testing.T, peers []string) {
	t.Helper()
	if len(peers) == 0 {
		t.Skipf("none of %v is installed (%s); set CI=true to make this a failure", peerNames, peersInstall)
	}
}

// Each installed peer is started from its written configuration, carries
// writes to the local upstream (the run checks that the upstream got every
// answered write and that none failed) and is measured.
func TestPeersRun(t *testing.T) {
	peers := peersFor(t)
	skipWithoutPeers(t, peers)
	var out, errOut bytes.Buffer
	args := []string{"-setups", "direct,bare-proxy,gateway," + strings.Join(peers, ","), "-duration", "600ms", "-rounds", "2", "-warmup", "100ms", "-concurrency", "4"}
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	for _, p := range peers {
		if !strings.Contains(out.String(), p+" / bare-proxy: throughput") {
			t.Fatalf("no %s ratio in\n%s", p, out.String())
		}
	}
	t.Log(out.String())
}

// Both ways of running the bare proxy and the gateway (their own
// processes, or this one) carry every write; the gateway's fenced.
func TestServersModes(t *testing.T) {
	for _, mode := range []string{"process", "inline"} {
		var out, errOut bytes.Buffer
		args := []string{"-servers", mode, "-setups", "direct,bare-proxy,gateway", "-duration", "600ms", "-rounds", "3", "-warmup", "100ms", "-concurrency", "4"}
		if code := run(args, &out, &errOut); code != 0 {
			t.Fatalf("%s: exit %d\n%s\n%s", mode, code, out.String(), errOut.String())
		}
		if !strings.Contains(out.String(), "gateway / bare-proxy: throughput") {
			t.Fatalf("%s: no gateway ratio in\n%s", mode, out.String())
		}
	}
}

// With -tls every proxy (the bare one, the gateway, the installed peers)
// is reached over TLS and carries every write.
func TestTLSRun(t *testing.T) {
	setups := append([]string{"direct", "bare-proxy", "gateway"}, peersFor(t)...)
	var out, errOut bytes.Buffer
	args := []string{"-tls", "-setups", strings.Join(setups, ","), "-duration", "600ms", "-rounds", "2", "-warmup", "100ms", "-concurrency", "4"}
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "HTTPS") || !strings.Contains(out.String(), "gateway / bare-proxy: throughput") {
		t.Fatalf("no TLS run in\n%s", out.String())
	}
}

// -grants -etcd-locks measures lock acquisitions on a real etcd beside the
// gateway's grants and reports the ratio. Under CI etcd must be installed
// (.ci/run installs Debian's etcd-server).
func TestGrantsBesideEtcd(t *testing.T) {
	if _, err := exec.LookPath("etcd"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: etcd is required (apt-get install etcd-server): %v", err)
		}
		t.Skipf("etcd not installed (%v); set CI=true to make this a failure", err)
	}
	locks := buildTool(t, "etcd-locks")
	var out, errOut bytes.Buffer
	if code := run([]string{"-grants", "-duration", "1s", "-warmup", "200ms", "-acquirers", "4", "-etcd-locks", locks}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	// etcd may refuse an acquisition on a loaded machine ("request timed
	// out" when its fsync stalls): that is the peer's figure, printed in its
	// row, not a failure of the tool.
	row := regexp.MustCompile(`etcd \(LeaseGrant \+ put-if-absent\)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)`).FindStringSubmatch(out.String())
	if row == nil || row[1] == "0" {
		t.Fatalf("no etcd row with acquisitions in\n%s", out.String())
	}
	if !strings.Contains(out.String(), "grants ÷ etcd acquisitions: ") {
		t.Fatalf("no ratio in\n%s", out.String())
	}
}

// -grants reports the gateway process's memory after its grants.
func TestGrantsMemoryReport(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-grants", "-duration", "500ms", "-warmup", "0", "-acquirers", "4"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "gateway process after ") || !strings.Contains(out.String(), "B anonymous per resource granted") {
		t.Fatalf("no memory report in\n%s", out.String())
	}
}

// A started peer answers through the upstream, reports its CPU, and stop
// leaves no process of its group. Under CI every peer must be installed
// (peersFor).
func TestPeerStartStop(t *testing.T) {
	peers := peersFor(t)
	skipWithoutPeers(t, peers)
	up, err := bench.StartUpstream()
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	client := bench.NewClient(1)
	defer client.CloseIdleConnections()
	for _, name := range peers {
		bin, err := lookPeer(name, "")
		if err != nil {
			t.Fatal(err)
		}
		p, err := startPeer(context.Background(), name, bin, up.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		before := up.Requests.Load()
		reply, err := bench.Write(context.Background(), client, bench.Target{URL: p.url.String() + bench.WritePath}, []byte("hello"), 0)
		if err != nil || !bytes.Equal(reply, bench.UpstreamReply) || up.Requests.Load() != before+1 {
			p.stop()
			t.Fatalf("%s: %q %v (upstream requests %d -> %d)", name, reply, err, before, up.Requests.Load())
		}
		if p.cpu() <= 0 {
			t.Errorf("%s: no CPU time read from /proc", name)
		}
		client.CloseIdleConnections()
		pgid := p.cmd.Process.Pid
		p.stop()
		if syscall.Kill(-pgid, 0) == nil {
			t.Fatalf("%s: processes of group %d are left after stop", name, pgid)
		}
	}
}
