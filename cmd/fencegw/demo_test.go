package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencegw/fencegw/gateway"
)

// The demo's replay shows the stale write landing without the gateway and
// refused through it, and cleans up after itself.
func TestDemo(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := runDemo(ctx, []string{"--exit"}, &stdout, &stderr); err != nil {
		t.Fatalf("runDemo: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	out := stdout.String()
	t.Log("\n" + out)
	run1, run2, ok := strings.Cut(out, "== run 2")
	if !ok {
		t.Fatal("no run 2")
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`\[ *\d+ ms\] A: pause begins`),
		regexp.MustCompile(`\[ *\d+ ms\] B: got token 2 `),
		regexp.MustCompile(`\[ *\d+ ms\] A: write token 1 directly to the statements service -> 200 OK: the stale write landed`),
		regexp.MustCompile(`after run 1 \(no fencing\): 8 lines, 4 duplicated`),
		regexp.MustCompile(`(?m)^ +5 .*\[by A, no token check\]  <- DUPLICATE$`),
	} {
		if !want.MatchString(run1) {
			t.Errorf("run 1 lacks %s", want)
		}
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`\[ *\d+ ms\] A: got token 3;`),
		regexp.MustCompile(`\[ *\d+ ms\] B: got token 4 `),
		regexp.MustCompile(`\[ *\d+ ms\] A: write token 3 -> 409 stale_token \(current token 4\): not forwarded`),
		regexp.MustCompile(`A: lease.Done\(\) is closed`),
		regexp.MustCompile(`after run 2 \(through fencegw\): 4 lines, 0 duplicated`),
		regexp.MustCompile(`rejection log .*: 1\n .*stale_token  token 3, current 4, holder worker-A, POST statements /accounts/88213/statement/lines`),
		regexp.MustCompile(`through fencegw: A's stale write was refused \(stale_token\), 0 duplicate lines`),
	} {
		if !want.MatchString(run2) {
			t.Errorf("run 2 lacks %s", want)
		}
	}
	if strings.Contains(run2, "DUPLICATE") || strings.Contains(run2, "token 3]") {
		t.Error("run 2's statement has A's lines")
	}
	if strings.Contains(out, "Ctrl-C") {
		t.Error("--exit still waits for Ctrl-C")
	}
	// A renewal the demo's own client cancelled is not a server error
	//: the demo's log shows warnings and errors only.
	if log := stderr.String(); strings.Contains(log, "level=ERROR") {
		t.Errorf("the demo logged an error:\n%s", log)
	}
}

// Without --exit the demo serves the dashboard until ctx ends.
func TestDemoServesUntilCancelled(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the incident")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr demoBuffer
	done := make(chan error, 1)
	go func() { done <- runDemo(ctx, []string{"--listen", "127.0.0.1:0"}, &stdout, &stderr) }()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(stdout.String(), "Press Ctrl-C") {
		select {
		case err := <-done:
			t.Fatalf("runDemo returned early: %v\n%s", err, stdout.String())
		case <-deadline:
			t.Fatalf("no dashboard line:\n%s", stdout.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	m := regexp.MustCompile(`dashboard http://(127\.0\.0\.1:\d+)/ui/`).FindStringSubmatch(stdout.String())
	if m == nil {
		t.Fatalf("no dashboard URL in:\n%s", stdout.String())
	}
	// The gateway left running checks Host (DNS rebinding): a page under
	// another name gets 403, the loopback names get through.
	for host, want := range map[string]int{"evil.example": http.StatusForbidden, m[1]: http.StatusOK, "localhost": http.StatusOK} {
		req, _ := http.NewRequest("GET", "http://"+m[1]+"/v1/rejections", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("runDemo did not return after cancel")
	}
}

func TestDemoBadFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := runDemo(context.Background(), []string{"--nope"}, &stdout, &stderr)
	if !errors.Is(err, errUsage) {
		t.Fatalf("err = %v, want a usage error", err)
	}
}

// demoBuffer is a bytes.Buffer safe to write and read concurrently.
type demoBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *demoBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *demoBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// The demo's gateway is built as serve builds it (replica.New): its
// listener refuses a request with both Content-Length and
// Transfer-Encoding, and a keyed write retried is replayed, not forwarded
// again.
func TestDemoGatewayHasFramingScanAndIdempotency(t *testing.T) {
	d, err := startDemo("127.0.0.1:0", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()

	conn, err := net.Dial("tcp", d.gwAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err = io.WriteString(conn, "POST /v1/leases HTTP/1.1\r\nHost: "+d.gwAddr+"\r\nContent-Type: application/json\r\n"+
		"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"field":"Content-Length, Transfer-Encoding"`) {
		t.Fatalf("Content-Length with Transfer-Encoding: %d %s, want 400 naming both", resp.StatusCode, body)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	post := func(path, body string, header ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.gwAddr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := d.tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	resp = post("/v1/leases", `{"resource":"`+demoResource+`","holder":"retrier","ttl_ms":60000}`, "Content-Type", "application/json")
	var lease struct {
		LeaseID string `json:"lease_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&lease); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("acquire: %d %v", resp.StatusCode, err)
	}
	for i, wantReplayed := range []string{"", "true"} {
		resp := post("/v1/proxy/"+demoUpstream+linesPath, "one line", gateway.HeaderLease, lease.LeaseID,
			gateway.HeaderIdempotencyKey, `"statement-88213"`, writerHeader, "retrier")
		if resp.StatusCode != http.StatusOK || resp.Header.Get(gateway.HeaderReplayed) != wantReplayed {
			t.Fatalf("keyed write %d: %d, %s %q; want 200, %q", i+1, resp.StatusCode, gateway.HeaderReplayed,
				resp.Header.Get(gateway.HeaderReplayed), wantReplayed)
		}
	}
	if lines := d.stmts.lines(demoAccount); len(lines) != 1 {
		t.Fatalf("the statements service got %d lines, want the one write once: %v", len(lines), lines)
	}
}
