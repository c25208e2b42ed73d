// `fencegw demo`: the stale-write incident replayed without and with the
// gateway, on a replica built as serve builds it (replica.New), and a toy
// statements service to protect.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencegw/fencegw/api"
	"github.com/fencegw/fencegw/client"
	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/replica"
	"github.com/fencegw/fencegw/storage/mode"
)

// The incident's timing. A's lease is granted at about 0 ms; A works for
// demoWork, then stalls until demoPastTTL after its TTL ran out. B asks for
// the lease at demoBStart and gets it as soon as A's lease expires at the
// gateway.
const (
	demoTTL      = time.Second
	demoWork     = 300 * time.Millisecond
	demoPastTTL  = 1500 * time.Millisecond
	demoBStart   = 500 * time.Millisecond
	demoBWait    = 5 * time.Second
	demoAccount  = "88213"
	demoResource = "stmt:acct:" + demoAccount
	demoUpstream = "statements"
	writerHeader = "Statement-Writer"
)

// demoStatement is what the statement job writes for the account.
var demoStatement = []string{
	"2026-11-01  opening balance                1,204.10",
	"2026-11-03  card     CORNER GROCERY          -45.20",
	"2026-11-09  transfer SALARY NOVEMBER      +2,300.00",
	"2026-11-30  closing balance                3,458.90",
}

const demoUsage = `usage: fencegw demo [--listen ADDR] [--exit]

Replays the classic incident on an embedded gateway and a toy "statements"
service: worker A takes a lease, stalls past its TTL, worker B takes the
lease and writes the statement, A wakes up and writes too. First without the
gateway (the stale write lands: duplicate lines), then through it (409
stale_token, recorded). Then it keeps the gateway running so you can look at
the dashboard, until Ctrl-C.`

// runDemo is `fencegw demo`: it replays the incident without and with
// fencing, prints the timelines and the resulting statements, then serves
// the gateway (and its dashboard) until ctx is cancelled, or returns at once
// with --exit. Bad flags return a usage error.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, demoUsage)
		fs.PrintDefaults()
	}
	listen := fs.String("listen", "127.0.0.1:0", "gateway address (port 0: any free port)")
	var exit bool
	fs.BoolVar(&exit, "exit", false, "exit right after the replay instead of serving the dashboard")
	fs.BoolVar(&exit, "once", false, "same as --exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usageError("demo: %v", err)
	}
	if fs.NArg() > 0 {
		return usageError("demo: unexpected argument %q", fs.Arg(0))
	}

	d, err := startDemo(*listen, stderr)
	if err != nil {
		return err
	}
	defer d.close()

	fmt.Fprintf(stdout, "fencegw demo: gateway on http://%s (embedded store in %s), statements service on http://%s\n",
		d.gwAddr, d.dir, d.upAddr)
	fmt.Fprintf(stdout, "worker A holds lease %s with a %v TTL, stalls until %v past it; worker B takes the lease meanwhile.\n",
		demoResource, demoTTL, demoPastTTL)

	runs := []struct {
		title  string
		fenced bool
	}{
		{"run 1: without fencing — the workers use the lease, but write straight to the statements service", false},
		{"run 2: through fencegw — the same workers, the same code, writes sent through the gateway", true},
	}
	var results []demoResult
	for i, r := range runs {
		fmt.Fprintf(stdout, "\n== %s\n", r.title)
		res, err := d.replay(ctx, stdout, r.fenced)
		if ctx.Err() != nil {
			fmt.Fprintln(stdout, "interrupted")
			return nil
		}
		if err != nil {
			return fmt.Errorf("demo run %d: %w", i+1, err)
		}
		results = append(results, res)
		d.printStatement(stdout, i+1, r.fenced, res)
		if r.fenced {
			d.printRejections(ctx, stdout)
		}
	}

	fmt.Fprintln(stdout, "\n== summary")
	fmt.Fprintf(stdout, "without fencing: A's stale write landed, %d duplicate lines in the statement.\n", results[0].duplicates)
	fmt.Fprintf(stdout, "through fencegw: A's stale write was refused (%s), %d duplicate lines; the refusal is recorded.\n",
		results[1].staleCode, results[1].duplicates)
	if exit {
		return nil
	}
	fmt.Fprintf(stdout, "\nThe gateway keeps running: dashboard http://%s/ui/ , rejections http://%s/v1/rejections , fenced writes http://%s/v1/proxy/%s/...\nPress Ctrl-C to stop.\n",
		d.gwAddr, d.gwAddr, d.gwAddr, demoUpstream)
	<-ctx.Done()
	return nil
}

// demo is the running gateway, statements service and the two workers'
// clients.
type demo struct {
	dir            string
	gwAddr, upAddr string
	upSrv          *http.Server
	// replica is the gateway, built as fencegw serve builds it (framing
	// scan, Idempotency-Key records, dashboard) on the embedded mode.
	replica *replica.Replica
	stmts   *statements
	tr      *http.Transport
	freezeA *freezer
	a, b    *client.Client
	api     *api.ClientWithResponses
}

func startDemo(listen string, stderr io.Writer) (d *demo, err error) {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d = &demo{stmts: &statements{}, tr: &http.Transport{Proxy: nil}}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.dir, err = os.MkdirTemp("", "fencegw-demo-"); err != nil {
		return nil, fmt.Errorf("create temp dir: %w", err)
	}

	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for the statements service: %w", err)
	}
	d.upAddr = upLn.Addr().String()
	d.upSrv = &http.Server{Handler: d.stmts, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = d.upSrv.Serve(upLn) }()

	upURL, _ := url.Parse("http://" + d.upAddr)
	d.replica, err = replica.New(context.Background(), replica.Config{
		Mode:   mode.Config{Data: d.dir},
		Listen: listen,
		Live: gateway.Live{
			Upstreams: map[string]*url.URL{demoUpstream: upURL},
			// It stays up on loopback after the replay, which is where a
			// page rebinding its own name to 127.0.0.1 reaches (hosts.go).
			AllowedHosts: demoHosts(listen),
		},
		Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	d.replica.Start()
	d.gwAddr = d.replica.Addr()

	base := "http://" + d.gwAddr
	d.freezeA = &freezer{base: d.tr}
	if d.a, err = client.New(base, client.WithHTTPClient(&http.Client{Transport: d.freezeA}), client.WithHolder("worker-A")); err != nil {
		return nil, err
	}
	if d.b, err = client.New(base, client.WithHTTPClient(&http.Client{Transport: d.tr}), client.WithHolder("worker-B")); err != nil {
		return nil, err
	}
	if d.api, err = api.NewClientWithResponses(base, api.WithHTTPClient(&http.Client{Transport: d.tr})); err != nil {
		return nil, err
	}
	return d, nil
}

// demoHosts are the names the demo's gateway answers to: the loopback
// names, and the listen address if it names one IP.
func demoHosts(listen string) []string {
	hosts := append([]string(nil), gateway.LoopbackHosts...)
	if host, _, err := net.SplitHostPort(listen); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
			hosts = append(hosts, host)
		}
	}
	return hosts
}

func (d *demo) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if d.replica != nil {
		d.replica.Close()
	}
	if d.upSrv != nil {
		_ = d.upSrv.Shutdown(ctx)
	}
	d.tr.CloseIdleConnections()
	if d.dir != "" {
		_ = os.RemoveAll(d.dir)
	}
}

// demoResult is what one run left behind.
type demoResult struct {
	lines      []statementLine
	duplicates int
	staleCode  string // the code A's stale write got, through the gateway
}

// timeline prints events with the milliseconds since the run began.
type timeline struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (t *timeline) say(who, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, "[%4d ms] %s: %s\n", time.Since(t.start).Milliseconds(), who, fmt.Sprintf(format, args...))
}

// replay runs the incident once: A and B concurrently, writes straight to
// the statements service or through the gateway.
func (d *demo) replay(ctx context.Context, out io.Writer, fenced bool) (demoResult, error) {
	d.stmts.reset()
	tl := &timeline{w: out, start: time.Now()}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var res demoResult
	var wg sync.WaitGroup
	var errA, errB error
	wg.Go(func() {
		if errA = d.workerA(ctx, tl, fenced, &res); errA != nil {
			cancel()
		}
	})
	wg.Go(func() {
		if errB = d.workerB(ctx, tl, fenced); errB != nil {
			cancel()
		}
	})
	wg.Wait()
	if err := errors.Join(errA, errB); err != nil {
		return res, err
	}
	res.lines = d.stmts.lines(demoAccount)
	res.duplicates = countDuplicates(res.lines)
	return res, nil
}

func (d *demo) workerA(ctx context.Context, tl *timeline, fenced bool, res *demoResult) error {
	tl.say("A", "acquire %s (ttl %v)", demoResource, demoTTL)
	lease, err := d.a.Acquire(ctx, demoResource, client.AcquireOptions{TTL: demoTTL})
	if err != nil {
		return fmt.Errorf("A: acquire: %w", err)
	}
	defer func() { _ = lease.Close() }()
	tl.say("A", "got token %d; building the statement", lease.Token())
	if err := sleep(ctx, demoWork); err != nil {
		return err
	}
	if err := lease.Err(); err != nil {
		return fmt.Errorf("A: lease lost before the pause: %w", err)
	}
	tl.say("A", "lease still held (checked) -- about to write %d lines", len(demoStatement))
	tl.say("A", "pause begins (stop-the-world GC, stalled VM: the lease's keep-alive freezes too)")
	d.freezeA.freeze()
	err = sleep(ctx, demoTTL+demoPastTTL-demoWork)
	d.freezeA.thaw()
	if err != nil {
		return err
	}
	tl.say("A", "pause ends, %v past its TTL; A carries on with the write it had started", demoPastTTL)

	if !fenced {
		status, err := d.writeDirect(ctx, "A", demoStatement)
		if err != nil {
			return fmt.Errorf("A: write: %w", err)
		}
		tl.say("A", "write token %d directly to the statements service -> %d %s: the stale write landed",
			lease.Token(), status, http.StatusText(status))
		return nil
	}
	resp, err := d.writeFenced(ctx, lease, "A", demoStatement)
	var pe *client.Error
	switch {
	case errors.As(err, &pe) && errors.Is(err, client.ErrStale):
		res.staleCode = pe.Code
		tl.say("A", "write token %d -> %d %s (current token %d): not forwarded, nothing duplicated",
			pe.Token, pe.Status, pe.Code, pe.CurrentToken)
		select {
		case <-lease.Done():
			tl.say("A", "lease.Done() is closed; A drops the job")
		default:
		}
		return nil
	case err != nil:
		return fmt.Errorf("A: write: %w", err)
	}
	_ = resp.Body.Close()
	tl.say("A", "write token %d -> %d: the stale write was NOT refused", lease.Token(), resp.StatusCode)
	return nil
}

func (d *demo) workerB(ctx context.Context, tl *timeline, fenced bool) error {
	if err := sleep(ctx, demoBStart); err != nil {
		return err
	}
	tl.say("B", "A looks stuck; acquire %s (waiting up to %v)", demoResource, demoBWait)
	lease, err := d.b.Acquire(ctx, demoResource, client.AcquireOptions{TTL: demoTTL, Wait: demoBWait})
	if err != nil {
		return fmt.Errorf("B: acquire: %w", err)
	}
	defer func() { _ = lease.Close() }()
	tl.say("B", "got token %d (A's lease expired at the gateway)", lease.Token())
	if fenced {
		resp, err := d.writeFenced(ctx, lease, "B", demoStatement)
		if err != nil {
			return fmt.Errorf("B: write: %w", err)
		}
		_ = resp.Body.Close()
		tl.say("B", "write token %d through the gateway -> %d %s (%d lines)", lease.Token(), resp.StatusCode, http.StatusText(resp.StatusCode), len(demoStatement))
	} else {
		status, err := d.writeDirect(ctx, "B", demoStatement)
		if err != nil {
			return fmt.Errorf("B: write: %w", err)
		}
		tl.say("B", "write token %d directly to the statements service -> %d %s (%d lines)", lease.Token(), status, http.StatusText(status), len(demoStatement))
	}
	if err := lease.Release(ctx); err != nil {
		return fmt.Errorf("B: release: %w", err)
	}
	tl.say("B", "released the lease; done")
	return nil
}

const linesPath = "/accounts/" + demoAccount + "/statement/lines"

// writeDirect posts the lines straight to the statements service, as a
// worker protected by nothing but its lease would.
func (d *demo) writeDirect(ctx context.Context, writer string, lines []string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.upAddr+linesPath, strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		return 0, err
	}
	req.Header.Set(writerHeader, writer)
	resp, err := d.tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// writeFenced posts the lines through the gateway under lease.
func (d *demo) writeFenced(ctx context.Context, lease *client.Lease, writer string, lines []string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+demoUpstream+linesPath, strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		return nil, err
	}
	req.Header.Set(writerHeader, writer)
	return lease.Do(req)
}

func (d *demo) printStatement(w io.Writer, run int, fenced bool, res demoResult) {
	how := "no fencing"
	if fenced {
		how = "through fencegw"
	}
	fmt.Fprintf(w, "-- statement of account %s after run %d (%s): %d lines, %d duplicated\n",
		demoAccount, run, how, len(res.lines), res.duplicates)
	seen := map[string]bool{}
	for i, l := range res.lines {
		by := "by " + l.Writer + ", no token check"
		if l.Token != "" {
			by = "by " + l.Writer + ", token " + l.Token
		}
		mark := ""
		if seen[l.Text] {
			mark = "  <- DUPLICATE"
		}
		seen[l.Text] = true
		fmt.Fprintf(w, "  %2d  %s   [%s]%s\n", i+1, l.Text, by, mark)
	}
}

func (d *demo) printRejections(ctx context.Context, w io.Writer) {
	res := demoResource
	resp, err := d.api.ListRejectionsWithResponse(ctx, &api.ListRejectionsParams{Resource: &res})
	if err != nil || resp.JSON200 == nil {
		fmt.Fprintf(w, "-- gateway rejection log: unavailable (%v)\n", err)
		return
	}
	fmt.Fprintf(w, "-- gateway rejection log (GET /v1/rejections?resource=%s): %d\n", demoResource, len(resp.JSON200.Items))
	for _, r := range resp.JSON200.Items {
		fmt.Fprintf(w, "  %s  %s  token %d, current %d, holder %s, %s %s %s\n",
			r.At.Local().Format("15:04:05.000"), r.Code, r.Token, r.CurrentToken, r.Holder, r.Method, r.Upstream, r.Path)
	}
}

func countDuplicates(lines []statementLine) int {
	seen, dup := map[string]bool{}, 0
	for _, l := range lines {
		if seen[l.Text] {
			dup++
		}
		seen[l.Text] = true
	}
	return dup
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// freezer stands for a stalled process: while frozen, its requests (the
// lease's renewals) wait until it thaws or they time out.
type freezer struct {
	base   http.RoundTripper
	mu     sync.Mutex
	thawed chan struct{} // nil while not frozen
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thawed == nil {
		f.thawed = make(chan struct{})
	}
}

func (f *freezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thawed != nil {
		close(f.thawed)
		f.thawed = nil
	}
}

func (f *freezer) RoundTrip(r *http.Request) (*http.Response, error) {
	f.mu.Lock()
	thawed := f.thawed
	f.mu.Unlock()
	if thawed != nil {
		select {
		case <-thawed:
		case <-r.Context().Done():
			if r.Body != nil {
				_ = r.Body.Close()
			}
			return nil, r.Context().Err()
		}
	}
	return f.base.RoundTrip(r)
}

// statements is the toy protected service: it appends the lines it is sent
// to an account's statement, trusting whoever sends them.
type statements struct {
	mu       sync.Mutex
	accounts map[string][]statementLine
}

type statementLine struct {
	Text   string `json:"text"`
	Writer string `json:"writer"`
	Token  string `json:"token,omitempty"` // the Fencing-Token the gateway added, if any
}

func (s *statements) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.accounts = map[string][]statementLine{}
}

func (s *statements) lines(account string) []statementLine {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]statementLine(nil), s.accounts[account]...)
}

// ServeHTTP: POST /accounts/{id}/statement/lines appends the body's lines;
// GET returns the statement as JSON.
func (s *statements) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/accounts/")
	account, tail, _ := strings.Cut(rest, "/")
	if !ok || account == "" || tail != "statement/lines" {
		http.NotFound(w, r)
		return
	}
	switch r.Method {
	case http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.lines(account))
	case http.MethodPost:
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writer := r.Header.Get(writerHeader)
		token := r.Header.Get(gateway.HeaderToken)
		s.mu.Lock()
		if s.accounts == nil {
			s.accounts = map[string][]statementLine{}
		}
		n := 0
		for line := range strings.SplitSeq(string(body), "\n") {
			if line = strings.TrimSpace(line); line != "" {
				s.accounts[account] = append(s.accounts[account], statementLine{Text: line, Writer: writer, Token: token})
				n++
			}
		}
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "appended "+strconv.Itoa(n)+" lines\n")
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}
