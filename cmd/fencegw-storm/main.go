// Command fencegw-storm measures what a storm of stale writes costs the
// current holder of a resource, and whether the dashboard stays usable
// meanwhile.
//
// It starts a real `fencegw serve` process (extra arguments after "--" go to
// it, e.g. `-- --postgres URL`), an upstream that answers 200, and in this
// process the current holder of stmt:hot, which writes serially through the
// gateway, and -streams dashboard clients following /v1/rejections/stream.
// A superseded holder of the same resource is the storm: a second process
// (this binary with -generate) sends its stale writes at a fixed rate from
// -storm-workers connections. Phases without a storm and with one alternate
// (-rounds), so that drift on the machine hits both alike, and every phase
// reports the holder's latency, the stale writes refused per second, the
// gateway process's CPU and the dashboard's answer times.
//
// On one small machine the storm's own HTTP client competes with the
// gateway for the same cores; a real storm comes from other machines. The
// generator therefore runs at -storm-nice (default 19), which lets it use
// idle CPU without taking it from the gateway, the upstream or the holder.
// -storm-nice 0 measures everything at the same priority.
//
// Every run is bounded: phases are capped, every request times out, and the
// child processes are killed on exit.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fencegw/fencegw/bench"
)

const (
	resource   = "stmt:hot"
	maxPhase   = 2 * time.Minute
	reqTimeout = 10 * time.Second
)

type options struct {
	gatewayBin   string
	rates        []int
	phase        time.Duration
	rounds       int
	streams      int
	stormWorkers int
	stormNice    int
	jsonOut      string
	serveArgs    []string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-generate" {
		os.Exit(generate(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("fencegw-storm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.gatewayBin, "gateway-bin", "", "the fencegw binary (default: go build ./cmd/fencegw)")
	rates := fs.String("rates", "1000,3000,5000", "stale writes per second of each storm phase, comma-separated")
	fs.DurationVar(&o.phase, "phase", 5*time.Second, "length of each measured phase (at most 2m)")
	fs.IntVar(&o.rounds, "rounds", 2, "times each storm phase and its baseline are run, alternating")
	fs.IntVar(&o.streams, "streams", 3, "dashboard clients following the rejection stream")
	fs.IntVar(&o.stormWorkers, "storm-workers", 16, "connections the stale writer sends from")
	fs.IntVar(&o.stormNice, "storm-nice", 19, "niceness of the storm generator process (0: same priority as the gateway)")
	fs.StringVar(&o.jsonOut, "json", "", "write the phases as JSON to this file")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fencegw-storm [flags] [-- fencegw serve flags]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.serveArgs = fs.Args()
	for f := range strings.SplitSeq(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || n > 100_000 {
			return o, fmt.Errorf("-rates: %q is not a rate between 1 and 100000", f)
		}
		o.rates = append(o.rates, n)
	}
	switch {
	case o.phase <= 0 || o.phase > maxPhase:
		return o, fmt.Errorf("-phase must be in (0, %v]", maxPhase)
	case o.rounds < 1 || o.rounds > 20:
		return o, errors.New("-rounds must be 1 to 20")
	case o.streams < 0 || o.streams > 100:
		return o, errors.New("-streams must be 0 to 100")
	case o.stormWorkers < 1 || o.stormWorkers > 1024:
		return o, errors.New("-storm-workers must be 1 to 1024")
	case o.stormNice < 0 || o.stormNice > 19:
		return o, errors.New("-storm-nice must be 0 to 19")
	}
	return o, nil
}

// phaseResult is one measured phase.
type phaseResult struct {
	Name         string  `json:"name"`
	Round        int     `json:"round"`
	TargetRate   int     `json:"target_rate"`
	StaleRefused int64   `json:"stale_refused"`
	StalePerSec  float64 `json:"stale_per_sec"`
	HolderWrites int     `json:"holder_writes"`
	MeanUS       float64 `json:"holder_mean_us"`
	P50US        float64 `json:"holder_p50_us"`
	P90US        float64 `json:"holder_p90_us"`
	P99US        float64 `json:"holder_p99_us"`
	GatewayCPU   float64 `json:"gateway_cpu_percent"`
	GatewayRSSMB float64 `json:"gateway_rss_mb"` // at the end of the phase
	DashP50MS    float64 `json:"dashboard_p50_ms"`
	DashMaxMS    float64 `json:"dashboard_max_ms"`
	DashErrors   int     `json:"dashboard_errors"`
}

func run(args []string, stdout, stderr io.Writer) int {
	// The gateway's and the generator's output are copied into stderr by
	// goroutines of os/exec, beside this process's own progress lines.
	stderr = &syncWriter{w: stderr}
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "fencegw-storm: "+err.Error())
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, err := measure(ctx, o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "fencegw-storm: "+err.Error())
		return 1
	}
	printResults(stdout, results)
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(o.jsonOut, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(stderr, "fencegw-storm: "+err.Error())
			return 1
		}
	}
	return 0
}

func measure(ctx context.Context, o options, stderr io.Writer) ([]phaseResult, error) {
	dir, err := os.MkdirTemp("", "fencegw-storm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if o.gatewayBin == "" {
		o.gatewayBin = filepath.Join(dir, "fencegw")
		build := exec.CommandContext(ctx, "go", "build", "-o", o.gatewayBin, "./cmd/fencegw")
		build.Stderr = stderr
		if err := build.Run(); err != nil {
			return nil, fmt.Errorf("build the gateway (run from the repository root, or give -gateway-bin): %w", err)
		}
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	}))
	defer up.Close()

	gw, err := startGateway(ctx, o, dir, up.URL, stderr)
	if err != nil {
		return nil, err
	}
	defer gw.stop()

	client := &http.Client{Timeout: reqTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	old, err := acquire(ctx, client, gw.url, "worker-old", 100*time.Millisecond)
	if err != nil {
		return nil, err
	}
	time.Sleep(150 * time.Millisecond)
	cur, err := acquire(ctx, client, gw.url, "worker-current", time.Hour)
	if err != nil {
		return nil, err
	}

	streamCtx, stopStreams := context.WithCancel(ctx)
	defer stopStreams()
	for range o.streams {
		if err := follow(streamCtx, gw.url); err != nil {
			return nil, err
		}
	}

	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	m := &meter{o: o, client: client, gw: gw, holderLease: cur, staleLease: old, self: self, stderr: stderr}
	if _, err := m.holderPhase(ctx, time.Second); err != nil { // warm up
		return nil, err
	}
	var results []phaseResult
	for round := 1; round <= o.rounds; round++ {
		for _, rate := range o.rates {
			for _, r := range []int{0, rate} {
				res, err := m.phase(ctx, r)
				if err != nil {
					return nil, err
				}
				res.Round = round
				results = append(results, res)
				fmt.Fprintf(stderr, "round %d %-16s holder mean %7.0f µs  stale %6.0f/s  gateway CPU %5.1f%%\n",
					round, res.Name, res.MeanUS, res.StalePerSec, res.GatewayCPU)
			}
		}
	}
	return results, nil
}

// gateway is a running fencegw serve process.
type gateway struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

func (g *gateway) stop() {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

func startGateway(ctx context.Context, o options, dir, upstream string, stderr io.Writer) (*gateway, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	args := append([]string{"serve", "--listen", addr, "--data", filepath.Join(dir, "data"),
		"--upstream", "up=" + upstream, "--log-level", "warn", "--shutdown-delay", "0"}, o.serveArgs...)
	cmd := exec.Command(o.gatewayBin, args...)
	cmd.Stdout, cmd.Stderr = io.Discard, stderr // stdout is the startup banner
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the gateway: %w", err)
	}
	g := &gateway{url: "http://" + addr, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(g.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(g.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return g, nil
			}
		}
		select {
		case <-g.done:
			return nil, errors.New("the gateway exited at start (its log is above)")
		case <-ctx.Done():
			g.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			g.stop()
			return nil, errors.New("the gateway was not ready within 30s")
		}
	}
}

func acquire(ctx context.Context, c *http.Client, base, holder string, ttl time.Duration) (string, error) {
	body := fmt.Sprintf(`{"resource":%q,"holder":%q,"ttl_ms":%d,"wait_ms":5000}`, resource, holder, ttl.Milliseconds())
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/leases", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("acquire %s: %d %s", holder, resp.StatusCode, b)
	}
	var l struct {
		LeaseID string `json:"lease_id"`
	}
	if err := json.Unmarshal(b, &l); err != nil || l.LeaseID == "" {
		return "", fmt.Errorf("acquire %s: no lease id in %s", holder, b)
	}
	return l.LeaseID, nil
}

// follow reads the rejection stream as a dashboard does, until ctx ends.
func follow(ctx context.Context, base string) error {
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/rejections/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return fmt.Errorf("rejection stream: %d", resp.StatusCode)
	}
	go func() {
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	return nil
}

type meter struct {
	o           options
	client      *http.Client
	gw          *gateway
	holderLease string
	staleLease  string
	self        string
	stderr      io.Writer
}

// phase runs the holder for one phase, with a storm of rate stale writes a
// second (none if 0), and a dashboard reader.
func (m *meter) phase(ctx context.Context, rate int) (phaseResult, error) {
	res := phaseResult{Name: "no storm", TargetRate: rate}
	if rate > 0 {
		res.Name = fmt.Sprintf("storm %d/s", rate)
	}
	var storm *exec.Cmd
	var out bytes.Buffer
	if rate > 0 {
		storm = exec.CommandContext(ctx, m.self, "-generate", "-target", m.gw.url+"/v1/proxy/up/lines",
			"-lease", m.staleLease, "-rate", strconv.Itoa(rate), "-workers", strconv.Itoa(m.o.stormWorkers))
		storm.Stdout, storm.Stderr = &out, m.stderr
		stdin, err := storm.StdinPipe()
		if err != nil {
			return res, err
		}
		if err := storm.Start(); err != nil {
			return res, fmt.Errorf("start the storm: %w", err)
		}
		if m.o.stormNice > 0 {
			if err := syscall.Setpriority(syscall.PRIO_PROCESS, storm.Process.Pid, m.o.stormNice); err != nil {
				fmt.Fprintf(m.stderr, "fencegw-storm: could not renice the storm: %v\n", err)
			}
		}
		defer func() {
			stdin.Close() // the generator stops at EOF on stdin
			_ = storm.Wait()
		}()
		time.Sleep(300 * time.Millisecond) // let it reach its rate
	}
	dashCtx, stopDash := context.WithCancel(ctx)
	var dash []time.Duration
	var dashErrors int
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; dashCtx.Err() == nil; i++ {
			path := "/ui/"
			if i%2 == 1 {
				path = "/ui/api/overview"
			}
			start := time.Now()
			req, _ := http.NewRequestWithContext(dashCtx, "GET", m.gw.url+path, nil)
			resp, err := m.client.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			switch {
			case dashCtx.Err() != nil:
				return
			case err != nil || resp.StatusCode != http.StatusOK:
				dashErrors++
			default:
				dash = append(dash, time.Since(start))
			}
			select {
			case <-dashCtx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
	cpu0 := bench.GroupCPU(m.gw.cmd.Process.Pid)
	start := time.Now()
	var refused0 int64
	if storm != nil {
		refused0 = stormCount(m.gw.url)
	}
	lat, err := m.holderPhase(ctx, m.o.phase)
	elapsed := time.Since(start)
	if storm != nil {
		res.StaleRefused = stormCount(m.gw.url) - refused0
	}
	cpu1 := bench.GroupCPU(m.gw.cmd.Process.Pid)
	if mem, err := bench.ReadMemory(m.gw.cmd.Process.Pid); err == nil {
		res.GatewayRSSMB = mem.MiB("VmRSS")
	}
	stopDash()
	wg.Wait()
	if err != nil {
		return res, err
	}
	res.StalePerSec = float64(res.StaleRefused) / elapsed.Seconds()
	res.GatewayCPU = 100 * float64(cpu1-cpu0) / float64(elapsed)
	res.HolderWrites = len(lat)
	sum := bench.Summarize(lat)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	res.MeanUS, res.P50US, res.P90US, res.P99US = us(sum.Mean), us(sum.P50), us(sum.P90), us(sum.P99)
	res.DashErrors = dashErrors
	if len(dash) > 0 {
		slices.Sort(dash)
		res.DashP50MS = float64(dash[len(dash)/2]) / float64(time.Millisecond)
		res.DashMaxMS = float64(dash[len(dash)-1]) / float64(time.Millisecond)
	}
	return res, nil
}

// stormCount reads the gateway's count of stale_token refusals from its
// metrics, so that only refusals inside the measured window are counted.
func stormCount(base string) int64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var n float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, `fencegw_rejections_total{reason="stale_token"}`) {
			if f := strings.Fields(line); len(f) == 2 {
				v, _ := strconv.ParseFloat(f[1], 64)
				n += v
			}
		}
	}
	return int64(n)
}

// holderPhase writes serially as the current holder for d.
func (m *meter) holderPhase(ctx context.Context, d time.Duration) ([]time.Duration, error) {
	var lat []time.Duration
	for end := time.Now().Add(d); time.Now().Before(end); {
		req, _ := http.NewRequestWithContext(ctx, "POST", m.gw.url+"/v1/proxy/up/lines", strings.NewReader(`{"line":1}`))
		req.Header.Set("Fencing-Lease", m.holderLease)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := m.client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("holder write: %w", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("holder write: %d", resp.StatusCode)
		}
		lat = append(lat, time.Since(start))
	}
	return lat, nil
}

// printResults prints every phase, then each storm rate's holder latency
// against the no-storm phases of the same rounds.
func printResults(w io.Writer, results []phaseResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tphase\tstale refused/s\tholder writes\tmean µs\tp50 µs\tp90 µs\tp99 µs\tgateway CPU %\tRSS MiB\tdashboard p50 ms\tmax ms\terrors\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.0f\t%.1f\t%.1f\t%d\t\n", r.Round, r.Name, r.StalePerSec, r.HolderWrites,
			r.MeanUS, r.P50US, r.P90US, r.P99US, r.GatewayCPU, r.GatewayRSSMB, r.DashP50MS, r.DashMaxMS, r.DashErrors)
	}
	tw.Flush()
	fmt.Fprintln(w)
	type agg struct{ base, storm, rate, baseP50, stormP50 float64 }
	byRate := map[int]*agg{}
	var order []int
	for i := 0; i+1 < len(results); i += 2 {
		base, storm := results[i], results[i+1]
		a := byRate[storm.TargetRate]
		if a == nil {
			a = &agg{}
			byRate[storm.TargetRate] = a
			order = append(order, storm.TargetRate)
		}
		a.base += base.MeanUS
		a.storm += storm.MeanUS
		a.baseP50 += base.P50US
		a.stormP50 += storm.P50US
		a.rate += storm.StalePerSec
	}
	for _, rate := range order {
		a := byRate[rate]
		fmt.Fprintf(w, "storm %d/s (achieved %.0f/s): holder mean %.2f× the no-storm phases (%+.0f%%), p50 %.2f× (%+.0f%%)\n",
			rate, a.rate/float64(len(results)/2/len(order)), a.storm/a.base, 100*(a.storm/a.base-1), a.stormP50/a.baseP50, 100*(a.stormP50/a.baseP50-1))
	}
}

// generate is the storm: stale writes at -rate from -workers connections
// until stdin reaches EOF.
func generate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fencegw-storm -generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("target", "", "write URL")
	lease := fs.String("lease", "", "the superseded lease")
	rate := fs.Int("rate", 1000, "stale writes per second")
	workers := fs.Int("workers", 16, "connections")
	if err := fs.Parse(args); err != nil || *target == "" || *lease == "" || *rate <= 0 || *workers <= 0 {
		fmt.Fprintln(stderr, "fencegw-storm -generate: needs -target, -lease, -rate and -workers")
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	client := &http.Client{Timeout: reqTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: *workers, MaxConnsPerHost: *workers}}
	var sent, refused atomic.Int64
	var wg sync.WaitGroup
	interval := time.Duration(*workers) * time.Second / time.Duration(*rate)
	for w := range *workers {
		wg.Go(func() {
			// Spread the workers' ticks over the interval: aligned tickers
			// would send the storm in bursts of -workers requests, a load
			// no fleet of independent workers produces.
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval * time.Duration(w) / time.Duration(*workers)):
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				req, _ := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("%s/%d/%d", *target, w, i), strings.NewReader(`{}`))
				req.Header.Set("Fencing-Lease", *lease)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				sent.Add(1)
				if resp.StatusCode == http.StatusConflict {
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	fmt.Fprintf(stdout, "{\"sent\":%d,\"refused\":%d}\n", sent.Load(), refused.Load())
	return 0
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
