package main

import (
	"bytes"
	"context"
	"os"
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
}

// Each installed peer is started from its written configuration, carries
// writes to the local upstream (the run checks that the upstream got every
// answered write and that none failed) and is measured.
func TestPeersRun(t *testing.T) {
	peers := installedPeers()
	if len(peers) == 0 {
		t.Skip("none of nginx, haproxy, caddy is installed (apt-get install nginx-light haproxy caddy)")
	}
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
	setups := append([]string{"direct", "bare-proxy", "gateway"}, installedPeers()...)
	var out, errOut bytes.Buffer
	args := []string{"-tls", "-setups", strings.Join(setups, ","), "-duration", "600ms", "-rounds", "2", "-warmup", "100ms", "-concurrency", "4"}
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "HTTPS") || !strings.Contains(out.String(), "gateway / bare-proxy: throughput") {
		t.Fatalf("no TLS run in\n%s", out.String())
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
// leaves no process of its group.
func TestPeerStartStop(t *testing.T) {
	peers := installedPeers()
	if len(peers) == 0 {
		t.Skip("none of nginx, haproxy, caddy is installed")
	}
	up, err := bench.StartUpstream()
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	client := bench.NewClient(1)
	defer client.CloseIdleConnections()
	for _, name := range peers {
		p, err := startPeer(context.Background(), name, up.URL, nil)
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
