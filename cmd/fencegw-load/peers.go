package main

// Peers: the proxies a user would otherwise run in front of the upstream
// (nginx, HAProxy, Caddy), started from configurations written into a
// temporary directory, on 127.0.0.1, each as the careful default a user
// would deploy: keep-alive to the upstream, X-Forwarded-For and -Proto set,
// no access log. They are measured in the same rotating slices as the
// in-process setups, and their own CPU is read from /proc.
//
// fasthttp is started as they are, but is not one of "peers": a bare
// reverse proxy on valyala/fasthttp (tools/fasthttp-ceiling, a module of
// its own so that fencegw's never depends on fasthttp), the ceiling of a
// Go gateway built on it, run only when named, from -fasthttp.

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencegw/fencegw/bench"
)

// peerNames are the peers the tool knows, in the order they are measured.
var peerNames = []string{"nginx", "haproxy", "caddy"}

// peerBinary is the program each peer runs as (fasthttp's is -fasthttp).
var peerBinary = map[string]string{"nginx": "nginx", "haproxy": "haproxy", "caddy": "caddy", "fasthttp": "fasthttp-ceiling"}

// fasthttpBuild is how to build fasthttp's program, from the repository's root.
const fasthttpBuild = "go build -C tools/fasthttp-ceiling -o /tmp/fasthttp-ceiling ."

// installedPeers are the peers whose program is on PATH (or in /usr/sbin,
// where Debian puts nginx and haproxy).
func installedPeers() []string {
	var out []string
	for _, p := range peerNames {
		if _, err := lookPeer(p, ""); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// lookPeer finds the program of peer name; fasthttpBin is -fasthttp, a
// name on PATH or a path (made absolute: the peer runs in its own
// directory).
func lookPeer(name, fasthttpBin string) (string, error) {
	if name == "fasthttp" {
		p, err := exec.LookPath(fasthttpBin)
		if err == nil {
			p, err = filepath.Abs(p)
		}
		if err != nil {
			return "", fmt.Errorf("fasthttp: no program %q (%w): build it with `%s` and pass -fasthttp /tmp/fasthttp-ceiling", fasthttpBin, err, fasthttpBuild)
		}
		return p, nil
	}
	bin := peerBinary[name]
	if p, err := exec.LookPath(bin); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin"} {
		p := filepath.Join(dir, bin)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not installed (Debian: apt-get install %s)", bin, map[string]string{"nginx": "nginx-light", "haproxy": "haproxy", "caddy": "caddy"}[name])
}

// peer is one running peer proxy.
type peer struct {
	name   string
	url    *url.URL
	cmd    *exec.Cmd
	dir    string
	exited chan struct{} // closed once the process is reaped
}

// startPeer writes name's configuration for a proxy on a free loopback
// port to upstream and starts program bin (lookPeer's) with it, waiting
// until it accepts connections.
func startPeer(ctx context.Context, name, bin string, upstream *url.URL, tt *testTLS) (*peer, error) {
	listen, dir, err := childPlace(name)
	if err != nil {
		return nil, err
	}
	conf, args := peerConfig(name, dir, listen, upstream.Host, tt)
	confPath := filepath.Join(dir, name+".conf")
	if conf != "" {
		if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "{conf}", confPath)
	}
	return startChild(ctx, name, bin, args, dir, listen, tt != nil)
}

// startSelf starts this program as the server of setup role ("gateway" or
// "bare-proxy") in a process of its own, forwarding to upstream, so that
// it is measured as the peers are: its own CPU, its own share of the
// machine. A -cpuprofile or -memprofile goes to the gateway's process.
func startSelf(ctx context.Context, o options, role string, upstream *url.URL, tt *testTLS, extra ...string) (*peer, error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	listen, dir, err := childPlace(role)
	if err != nil {
		return nil, err
	}
	args := []string{"-serve", role, "-serve-listen", listen, "-serve-upstream", upstream.String(), "-serve-dir", dir}
	if tt != nil {
		args = append(args, "-serve-tls-cert", tt.certFile, "-serve-tls-key", tt.keyFile)
	}
	if role == "gateway-postgres" {
		args = append(args, "-postgres", o.postgres)
	}
	args = append(args, extra...)
	if role == "gateway" {
		if o.cpuProfile != "" {
			args = append(args, "-cpuprofile", o.cpuProfile)
		}
		if o.memProfile != "" {
			args = append(args, "-memprofile", o.memProfile)
		}
	}
	return startChild(ctx, role, bin, args, dir, listen, tt != nil)
}

// childPlace picks a free loopback address for the child process name and
// makes its directory.
func childPlace(name string) (listen, dir string, err error) {
	port, err := freePort()
	if err != nil {
		return "", "", err
	}
	dir, err = os.MkdirTemp("", "fencegw-load-"+name+"-")
	if err != nil {
		return "", "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), dir, nil
}

// startChild runs bin in dir in a process group of its own and waits until
// it accepts connections on listen (speaking TLS there if tls). dir is
// removed when it stops.
func startChild(ctx context.Context, name, bin string, args []string, dir, listen string, tls bool) (*peer, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	// Caddy keeps state under HOME and XDG dirs: keep it in the temp dir.
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir, "GOMAXPROCS="+strconv.Itoa(runtime.GOMAXPROCS(0)))
	logFile, err := os.Create(filepath.Join(dir, "output.log"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, so that stopping it stops its workers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &peer{name: name, url: &url.URL{Scheme: "http", Host: listen}, cmd: cmd, dir: dir, exited: make(chan struct{})}
	if tls {
		p.url.Scheme = "https"
	}
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(p.exited) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-p.exited:
			out, _ := os.ReadFile(filepath.Join(dir, "output.log"))
			p.stop()
			return nil, fmt.Errorf("%s exited (%v) before it listened: %s", name, waitErr, strings.TrimSpace(string(out)))
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s did not listen on %s within 15s", name, listen)
		}
	}
	return p, nil
}

// stop ends the peer's process group (SIGTERM, then SIGKILL after 5 s)
// and removes its directory.
func (p *peer) stop() {
	pgid := p.cmd.Process.Pid // the group's id: Setpgid made the peer its leader
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		_ = syscall.Kill(-pgid, sig)
		deadline := time.Now().Add(5 * time.Second)
		<-p.waitFor(deadline)
		// The group is gone once signalling it fails (workers included);
		// a zombie nobody reaps would keep it, so this is bounded.
		for syscall.Kill(-pgid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if syscall.Kill(-pgid, 0) != nil {
			break
		}
	}
	_ = os.RemoveAll(p.dir)
}

// waitFor returns a channel that is ready once the leader is reaped or the
// deadline has passed.
func (p *peer) waitFor(deadline time.Time) <-chan struct{} {
	select {
	case <-p.exited:
		return p.exited
	default:
	}
	c := make(chan struct{})
	go func() {
		select {
		case <-p.exited:
		case <-time.After(time.Until(deadline)):
		}
		close(c)
	}()
	return c
}

// cpu is the CPU time the peer's processes (the group leader and its
// children: nginx's workers) have used so far, per thread, in ns.
func (p *peer) cpu() time.Duration {
	return bench.GroupCPU(p.cmd.Process.Pid)
}

// peerConfig returns the configuration text (none for fasthttp, which
// takes flags) and the arguments ({conf} is the configuration's path) of
// a peer listening on listen and forwarding to upstream (host:port).
func peerConfig(name, dir, listen, upstream string, tt *testTLS) (conf string, args []string) {
	nginxListen, haproxyBind, caddySite, caddyTLS := listen, listen, "http://"+listen, ""
	if tt != nil {
		nginxListen = listen + " ssl;\n        ssl_certificate " + tt.certFile + ";\n        ssl_certificate_key " + tt.keyFile + ";\n        ssl_session_cache shared:SSL:10m"
		haproxyBind = listen + " ssl crt " + tt.pemFile
		caddySite, caddyTLS = "https://"+listen, "\n    tls "+tt.certFile+" "+tt.keyFile
	}
	switch name {
	case "nginx":
		// As nginx is usually run: a master and one worker per core,
		// upstream keep-alive (HTTP/1.1, Connection cleared), request
		// buffering on (the default).
		return fmt.Sprintf(`daemon off;
master_process on;
worker_processes %d;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[2]s/client_body;
    proxy_temp_path %[2]s/proxy;
    fastcgi_temp_path %[2]s/fastcgi;
    uwsgi_temp_path %[2]s/uwsgi;
    scgi_temp_path %[2]s/scgi;
    upstream up {
        server %[3]s;
        keepalive 256;
    }
    server {
        listen %[4]s;
        location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
        }
    }
}
`, runtime.GOMAXPROCS(0), dir, upstream, nginxListen), []string{"-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", "{conf}"}
	case "haproxy":
		// One process, a thread per core, keep-alive on both sides (the
		// default), connection reuse to the upstream (http-reuse safe,
		// the default).
		return fmt.Sprintf(`global
    nbthread %d
    maxconn 8192
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    option forwardfor
frontend fe
    bind %s
    default_backend be
backend be
    server up %s
`, runtime.GOMAXPROCS(0), haproxyBind, upstream), []string{"-db", "-f", "{conf}"}
	case "caddy":
		// reverse_proxy keeps connections alive and sets X-Forwarded-*
		// itself; no admin endpoint, no automatic HTTPS, no access log.
		return fmt.Sprintf(`{
    admin off
    auto_https off
}
%s {%s
    reverse_proxy %s
}
`, caddySite, caddyTLS, upstream), []string{"run", "--adapter", "caddyfile", "--config", "{conf}"}
	case "fasthttp":
		// tools/fasthttp-ceiling: a fasthttp.Server handing each request
		// to a HostClient (keep-alive, up to 512 connections), with
		// X-Forwarded-For and -Proto set.
		args := []string{"-listen", listen, "-upstream", upstream}
		if tt != nil {
			args = append(args, "-tls-cert", tt.certFile, "-tls-key", tt.keyFile)
		}
		return "", args
	}
	panic("unknown peer " + name)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
