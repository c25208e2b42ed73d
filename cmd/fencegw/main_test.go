package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/internal/gcheadroom"
)

// The fencegw binary the tests run, built with -race on first use
// (fencegwBinary): a run that needs none (a fuzz target's coordinator and
// each of its workers, a listing of the tests) builds none.
var (
	binaryOnce sync.Once
	binaryDir  string
	binaryPath string
	binaryErr  error
)

// fencegwBinary returns the path of the fencegw binary, building it the
// first time.
func fencegwBinary(t testing.TB) string {
	t.Helper()
	binaryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fencegw-bin-")
		if err != nil {
			binaryErr = err
			return
		}
		binaryDir = dir
		path := filepath.Join(dir, "fencegw")
		if out, err := exec.Command("go", "build", "-race", "-o", path, ".").CombinedOutput(); err != nil {
			binaryErr = fmt.Errorf("build fencegw: %w\n%s", err, out)
			return
		}
		binaryPath = path
	})
	if binaryErr != nil {
		t.Fatal(binaryErr)
	}
	return binaryPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binaryDir != "" {
		os.RemoveAll(binaryDir)
	}
	os.Exit(code)
}

// proc is a running fencegw binary.
type proc struct {
	cmd    *exec.Cmd
	addr   string
	mu     sync.Mutex
	out    bytes.Buffer // stdout and stderr
	exited chan struct{}
	err    error // Wait's result, once exited is closed
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

var servingLine = regexp.MustCompile(`serving on https?://(\S+)`)

func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, nil, args...)
}

// startProcEnv is startProc with env added to the test's environment.
func startProcEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	// No shutdown delay unless a test asks for one (a later flag wins):
	// nothing balances load in front of these processes.
	return startBinaryEnv(t, fencegwBinary(t), env, append([]string{"--shutdown-delay", "0"}, args...)...)
}

// startBinary starts `bin serve` on a free port (a later --listen wins).
func startBinary(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	return startBinaryEnv(t, bin, nil, args...)
}

// startBinaryEnv is startBinary with env added to the test's environment.
func startBinaryEnv(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	cmd.Stderr = p
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			_, _ = p.Write([]byte(sc.Text() + "\n"))
			if m := servingLine.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	select {
	case p.addr = <-addr:
	case <-p.exited:
		t.Fatalf("fencegw exited: %v\n%s", p.err, p.output())
	case <-time.After(30 * time.Second):
		t.Fatalf("fencegw did not start:\n%s", p.output())
	}
	return p
}

func (p *proc) url() string { return "http://" + p.addr }

type lease struct {
	LeaseID string `json:"lease_id"`
	Token   int64  `json:"token"`
	State   string `json:"state"`
}

func post(t *testing.T, url string, body any, header ...string) (int, []byte) {
	t.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func acquire(t *testing.T, base, res, holder string, ttl, wait time.Duration) lease {
	t.Helper()
	code, body := post(t, base+"/v1/leases", map[string]any{"resource": res, "holder": holder, "ttl_ms": ttl.Milliseconds(), "wait_ms": wait.Milliseconds()})
	if code != http.StatusCreated {
		t.Fatalf("acquire %s: %d %s", res, code, body)
	}
	var l lease
	_ = json.Unmarshal(body, &l)
	return l
}

// kill -9 and restart on the same data: no token is reissued, superseded
// leases stay fenced, the current lease survives with its expiry.
func TestKillAndRestart(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
	}))
	defer up.Close()
	data := t.TempDir()
	args := []string{"--data", data, "--upstream", "svc=" + up.URL, "--drain-period", "300ms"}
	p := startProc(t, args...)

	a := acquire(t, p.url(), "crash", "A", 300*time.Millisecond, 0)
	waitExpired(t, p.url(), a.LeaseID)
	b := acquire(t, p.url(), "crash", "B", time.Minute, 0)

	// A storm of grants on other resources, killed mid-flight: every token
	// any worker saw must stay below what the restarted gateway grants next.
	ctx, cancel := context.WithCancel(context.Background())
	var seenMu sync.Mutex
	maxSeen := map[string]int64{}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := fmt.Sprintf("storm-%d", w%4)
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "POST", p.url()+"/v1/leases",
					strings.NewReader(`{"resource":"`+res+`","ttl_ms":100,"wait_ms":200}`))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				var l lease
				if resp.StatusCode == http.StatusCreated && json.NewDecoder(resp.Body).Decode(&l) == nil {
					seenMu.Lock()
					maxSeen[res] = max(maxSeen[res], l.Token)
					seenMu.Unlock()
					// Release at once so the next grant comes quickly.
					dreq, _ := http.NewRequest("DELETE", p.url()+"/v1/leases/"+l.LeaseID, nil)
					if r2, err := http.DefaultClient.Do(dreq); err == nil {
						r2.Body.Close()
					}
				}
				resp.Body.Close()
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	cancel()
	wg.Wait()
	if len(maxSeen) == 0 {
		t.Fatal("void run: no grant completed before the kill")
	}

	p2 := startProc(t, args...)
	// A was superseded before the crash and stays fenced.
	if code, body := post(t, p2.url()+"/v1/proxy/svc/x", "A stale", "Fencing-Lease", a.LeaseID); code != http.StatusConflict || !strings.Contains(string(body), "stale_token") {
		t.Fatalf("A after restart: %d %s", code, body)
	}
	// B's lease survived the crash and still writes.
	if code, body := post(t, p2.url()+"/v1/proxy/svc/x", "B after restart", "Fencing-Lease", b.LeaseID); code != http.StatusOK {
		t.Fatalf("B after restart: %d %s", code, body)
	}
	for res, seen := range maxSeen {
		next := acquire(t, p2.url(), res, "after", time.Second, 5*time.Second)
		if next.Token <= seen {
			t.Fatalf("%s: token %d granted after restart, but %d was already handed out", res, next.Token, seen)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, body := range bodies {
		if body == `"A stale"` {
			t.Fatal("A's stale write reached the upstream")
		}
	}
}

// SIGTERM drains in-flight writes before exiting 0.
func TestGracefulShutdownDrainsWrites(t *testing.T) {
	entered := make(chan struct{})
	var once sync.Once
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(entered) })
		time.Sleep(700 * time.Millisecond)
		_, _ = io.WriteString(w, "done")
	}))
	defer up.Close()
	p := startProc(t, "--data", t.TempDir(), "--upstream", "svc="+up.URL)
	l := acquire(t, p.url(), "drain", "A", 10*time.Second, 0)

	result := make(chan int, 1)
	go func() {
		code, _ := post(t, p.url()+"/v1/proxy/svc/x", "in flight", "Fencing-Lease", l.LeaseID)
		result <- code
	}()
	<-entered
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := <-result; code != http.StatusOK {
		t.Fatalf("in-flight write during shutdown: %d", code)
	}
	select {
	case <-p.exited:
		if p.err != nil {
			t.Fatalf("exit: %v\n%s", p.err, p.output())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("did not exit after SIGTERM")
	}
}

func TestExitCodes(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cases := []struct {
		args []string
		env  []string
		code int
		msg  string
	}{
		{[]string{"serve", "--forward-timeout", "soon"}, nil, 2, "forward-timeout"},
		{[]string{"serve", "--upstream", "nourl"}, nil, 2, "NAME=URL"},
		{[]string{"serve", "--max-body", "lots"}, nil, 2, "max-body"},
		{[]string{"serve", "--redis", "redis://127.0.0.1:6379"}, nil, 2, "--redis: needs --postgres"},
		{[]string{"serve", "--bogus"}, nil, 2, "bogus"},
		{[]string{"frobnicate"}, nil, 2, "unknown command"},
		{[]string{"serve"}, []string{"FENCEGW_GRANT_WAIT=forever"}, 2, "FENCEGW_GRANT_WAIT"},
		{[]string{"serve"}, []string{"FENCEGW_UPSTREAMS=a=http://x,b=ftp://y"}, 2, "FENCEGW_UPSTREAMS"},
		{[]string{"serve", "--listen", busy.Addr().String(), "--data", t.TempDir()}, nil, 1, "listen"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			cmd := exec.Command(fencegwBinary(t), c.args...)
			cmd.Env = append(os.Environ(), c.env...)
			cmd.Dir = t.TempDir()
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if code != c.code || !strings.Contains(stderr.String(), c.msg) {
				t.Fatalf("exit %d, stderr %q; want %d mentioning %q", code, stderr.String(), c.code, c.msg)
			}
			if c.code == 2 && len(lines) != 1 {
				t.Fatalf("want one line, got %q", lines)
			}
		})
	}
}

// Flags win over FENCEGW_* variables, which fill in the rest.
func TestConfigFromEnvironment(t *testing.T) {
	env := map[string]string{
		"FENCEGW_LISTEN":          "127.0.0.1:9999",
		"FENCEGW_UPSTREAMS":       "a=http://127.0.0.1:1, b=https://example.invalid/base",
		"FENCEGW_FORWARD_TIMEOUT": "5s",
		"FENCEGW_MAX_BODY":        "1MiB",
		"FENCEGW_DATA":            "/tmp/x",
	}
	cfg, err := parseServe([]string{"--listen", "127.0.0.1:7777"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:7777" || cfg.Data != "/tmp/x" || cfg.ForwardTimeout != 5*time.Second ||
		cfg.DrainPeriod != 5*time.Second || cfg.MaxBody != 1<<20 || len(cfg.Upstreams) != 2 || cfg.Upstreams["b"].Path != "/base" {
		t.Fatalf("config: %+v", cfg)
	}
}

// --gc-headroom takes a size, or 0 for Go's own collector; anything else is
// a usage error naming it.
func TestGCHeadroomFlag(t *testing.T) {
	none := func(string) string { return "" }
	for _, c := range []struct {
		args []string
		want int64
	}{
		{nil, gcheadroom.Default},
		{[]string{"--gc-headroom", "0"}, 0},
		{[]string{"--gc-headroom", "64MiB"}, 64 << 20},
		{[]string{"--gc-headroom", "1048576"}, 1 << 20},
	} {
		cfg, err := parseServe(c.args, none)
		if err != nil || cfg.GCHeadroom != c.want {
			t.Errorf("parseServe(%q): headroom %d, %v; want %d", c.args, cfg.GCHeadroom, err, c.want)
		}
	}
	cfg, err := parseServe(nil, func(k string) string { return map[string]string{"FENCEGW_GC_HEADROOM": "8MiB"}[k] })
	if err != nil || cfg.GCHeadroom != 8<<20 {
		t.Errorf("FENCEGW_GC_HEADROOM=8MiB: headroom %d, %v", cfg.GCHeadroom, err)
	}
	for _, bad := range []string{"-1", "lots", "17GiB", "0MiB"} {
		if _, err := parseServe([]string{"--gc-headroom", bad}, none); err == nil || !strings.Contains(err.Error(), "gc-headroom") {
			t.Errorf("--gc-headroom %s: %v, want an error naming the flag", bad, err)
		}
	}
}

// fencegw serve keeps the collector's headroom: once a collection has run,
// GOGC is what puts the heap's goal 32 MiB (at most an eighth of a memory
// limit) above twice the live heap, as
// /metrics shows (go_gc_gogc_percent, go_memstats_next_gc_bytes). With
// --gc-headroom 0, or GOGC in the environment, Go's collector runs as they
// say.
func TestServeKeepsTheCollectorsHeadroom(t *testing.T) {
	// 32 MiB, or an eighth of this machine's memory limit (the child's).
	headroom := gcheadroom.Capped(gcheadroom.Default, gcheadroom.MemoryLimit())
	for _, c := range []struct {
		name string
		env  []string
		args []string
		gogc float64 // 0: above 100, with the goal past the headroom
	}{
		{"default", nil, nil, 0},
		{"off", nil, []string{"--gc-headroom", "0"}, 100},
		{"GOGC", []string{"GOGC=50"}, nil, 50},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startProcEnv(t, c.env, append([]string{"--data", t.TempDir()}, c.args...)...)
			var m map[string]float64
			for deadline := time.Now().Add(30 * time.Second); ; {
				// Garbage, so that collections run: the spec, rendered.
				for range 20 {
					if a := call("GET", p.url()+"/v1/openapi.json", nil); a.err != nil || a.code != http.StatusOK {
						t.Fatalf("the spec: %v", a)
					}
				}
				m = scrapeMetrics(t, p.url(), "go_gc_duration_seconds_count", "go_gc_gogc_percent", "go_memstats_next_gc_bytes")
				// Two cycles: the tuner sets GOGC after the first it sees.
				ran := m["go_gc_duration_seconds_count"] >= 2
				if ran && c.gogc != 0 || ran && m["go_gc_gogc_percent"] > 100 && m["go_memstats_next_gc_bytes"] >= float64(headroom) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no headroom kept after 30 s of requests: %v", m)
				}
			}
			if c.gogc != 0 && (m["go_gc_gogc_percent"] != c.gogc || m["go_memstats_next_gc_bytes"] >= float64(headroom)) {
				t.Fatalf("GOGC %v with a goal of %v bytes, want %v and Go's own goal", m["go_gc_gogc_percent"], m["go_memstats_next_gc_bytes"], c.gogc)
			}
		})
	}
}

// scrapeMetrics reads the named unlabelled series from base's /metrics.
func scrapeMetrics(t *testing.T, base string, names ...string) map[string]float64 {
	t.Helper()
	a := call("GET", base+"/metrics", nil)
	if a.err != nil || a.code != http.StatusOK {
		t.Fatalf("%s/metrics: %v", base, a)
	}
	out := map[string]float64{}
	for line := range strings.SplitSeq(string(a.body), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if ok && slices.Contains(names, name) {
			if v, err := strconv.ParseFloat(value, 64); err == nil {
				out[name] = v
			}
		}
	}
	return out
}
