// Command go-statement-worker is the statement job of fencegw's story,
// written with the Go SDK: for each account it acquires the account's lease,
// builds the month's statement lines and writes them to the "statements"
// upstream through the gateway. With -stall it freezes past its TTL before
// writing, as a worker in a long GC pause would, and the gateway refuses
// the stale write.
//
//	go-statement-worker -serve 127.0.0.1:9090            run a toy statements service
//	go-statement-worker [-gateway URL] [-accounts 88213,88214] [-stall 5s] ...
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencegw/fencegw/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type config struct {
	gateway  string
	upstream string
	accounts []string
	holder   string
	ttl      time.Duration
	wait     time.Duration
	stall    time.Duration
	serve    string
}

// run is the whole program: 0 if every statement was written, 1 if any was
// refused or failed, 2 for bad flags.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("go-statement-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	var accounts string
	fs.StringVar(&cfg.gateway, "gateway", envOr("FENCEGW_URL", "http://127.0.0.1:8080"), "the gateway's base URL (env FENCEGW_URL)")
	fs.StringVar(&cfg.upstream, "upstream", "statements", "the statements service's upstream name in the gateway (--upstream NAME=URL)")
	fs.StringVar(&accounts, "accounts", "88213,88214", "comma-separated accounts to write statements for")
	fs.StringVar(&cfg.holder, "holder", "", "holder label shown on the dashboard (default HOSTNAME/PID)")
	fs.DurationVar(&cfg.ttl, "ttl", 10*time.Second, "lease TTL")
	fs.DurationVar(&cfg.wait, "wait", 0, "how long to wait for an account's lease held by another worker")
	fs.DurationVar(&cfg.stall, "stall", 0, "after building each statement, freeze this long before writing, keep-alive included (try more than -ttl)")
	fs.StringVar(&cfg.serve, "serve", "", "instead of working, run a toy statements service on this address (e.g. 127.0.0.1:9090)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	for a := range strings.SplitSeq(accounts, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.accounts = append(cfg.accounts, a)
		}
	}
	if cfg.serve != "" {
		if err := serveStatements(ctx, cfg.serve, stdout); err != nil {
			fmt.Fprintln(stderr, "go-statement-worker:", err)
			return 1
		}
		return 0
	}
	if len(cfg.accounts) == 0 {
		fmt.Fprintln(stderr, "go-statement-worker: -accounts is empty")
		return 2
	}
	opts := []client.Option{}
	if cfg.holder != "" {
		opts = append(opts, client.WithHolder(cfg.holder))
	}
	c, err := client.New(cfg.gateway, opts...)
	if err != nil {
		fmt.Fprintln(stderr, "go-statement-worker:", err)
		return 2
	}
	code := 0
	for _, acct := range cfg.accounts {
		if err := writeStatement(ctx, c, cfg, acct, stdout); err != nil {
			fmt.Fprintf(stdout, "account %s: %v\n", acct, err)
			code = 1
		}
		if ctx.Err() != nil {
			return 1
		}
	}
	return code
}

// writeStatement is one job: lease the account, build, write, release.
func writeStatement(ctx context.Context, c *client.Client, cfg config, acct string, out io.Writer) error {
	resource := "stmt:acct:" + acct
	lease, err := c.Acquire(ctx, resource, client.AcquireOptions{TTL: cfg.ttl, Wait: cfg.wait})
	if err != nil {
		var e *client.Error
		if errors.Is(err, client.ErrLeaseHeld) && errors.As(err, &e) {
			return fmt.Errorf("skipped: held by %s for %v more", e.Holder, time.Until(e.ExpiresAt).Round(time.Millisecond))
		}
		return fmt.Errorf("acquire: %w", err)
	}
	// Close releases the lease; after a refusal it reports the loss, which
	// the refusal already told.
	defer func() { _ = lease.Close() }()
	fmt.Fprintf(out, "account %s: lease %s, token %d\n", acct, resource, lease.Token())

	lines := buildStatement(acct)

	if cfg.stall > 0 {
		// A frozen process renews nothing: stop the keep-alive, as a GC
		// pause or SIGSTOP would, and sleep.
		fmt.Fprintf(out, "account %s: stalling %v with the keep-alive frozen (ttl %v)\n", acct, cfg.stall, cfg.ttl)
		lease.Orphan()
		select {
		case <-time.After(cfg.stall):
		case <-ctx.Done():
			return ctx.Err()
		}
		// No check of lease.Err() here on purpose: checks race with pauses.
		// The gateway's fence is what protects the write.
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		"http://"+cfg.upstream+"/accounts/"+acct+"/statement/lines", strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		return err
	}
	resp, err := lease.Do(req)
	var e *client.Error
	switch {
	case errors.Is(err, client.ErrStale) && errors.As(err, &e):
		return fmt.Errorf("write refused by the gateway: %s (token %d, current %d); nothing was written", e.Code, e.Token, e.CurrentToken)
	case errors.Is(err, client.ErrUnavailable):
		return fmt.Errorf("gateway unavailable, statement not written (retry later): %w", err)
	case err != nil:
		return fmt.Errorf("write: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("the statements service answered %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	fmt.Fprintf(out, "account %s: wrote %d lines under token %d\n", acct, len(lines), lease.Token())
	if err := lease.Release(ctx); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

// buildStatement stands for the real work: reading the ledger.
func buildStatement(acct string) []string {
	return []string{
		"acct " + acct + "  2026-11-01  opening balance              1,204.10",
		"acct " + acct + "  2026-11-03  card     CORNER GROCERY        -45.20",
		"acct " + acct + "  2026-11-09  transfer SALARY NOVEMBER    +2,300.00",
		"acct " + acct + "  2026-11-30  closing balance              3,458.90",
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// serveStatements runs a toy statements service: POST
// /accounts/{id}/statement/lines appends lines (trusting whoever sends
// them, as legacy services do); GET returns the statement, one line each,
// with the Fencing-Token the gateway added.
func serveStatements(ctx context.Context, addr string, out io.Writer) error {
	var mu sync.Mutex
	stmts := map[string][]string{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/accounts/")
		acct, tail, _ := strings.Cut(rest, "/")
		if !ok || acct == "" || tail != "statement/lines" {
			http.NotFound(w, r)
			return
		}
		token := r.Header.Get("Fencing-Token")
		if token == "" {
			token = "-"
		}
		switch r.Method {
		case http.MethodGet:
			mu.Lock()
			lines := append([]string(nil), stmts[acct]...)
			mu.Unlock()
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			for _, l := range lines {
				fmt.Fprintln(w, l)
			}
		case http.MethodPost:
			body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			n := 0
			mu.Lock()
			for l := range strings.SplitSeq(string(body), "\n") {
				if l = strings.TrimSpace(l); l != "" {
					stmts[acct] = append(stmts[acct], fmt.Sprintf("%-60s [token %s]", l, token))
					n++
				}
			}
			mu.Unlock()
			fmt.Fprintf(out, "%s appended %d lines to account %s (token %s)\n", time.Now().Format("15:04:05.000"), n, acct, token)
			fmt.Fprintf(w, "appended %d lines\n", n)
		default:
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Fprintf(out, "statements service on http://%s (GET/POST /accounts/{id}/statement/lines)\n", addr)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}
