package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// wsgiUpstream starts testdata/wsgi_upstream.py, a stock wsgiref server,
// and returns its base URL.
func wsgiUpstream(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed for the WSGI upstream: ", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, py, "testdata/wsgi_upstream.py")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close() // the server stops when its stdin closes
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cancel()
			<-done
		}
		cancel()
	})
	port, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal("the WSGI upstream did not start: ", err)
	}
	return "http://127.0.0.1:" + strings.TrimSpace(port)
}

// wsgiSeen is what the WSGI upstream was sent, asked of it directly.
func wsgiSeen(t *testing.T, base string) []string {
	t.Helper()
	resp, err := http.Get(base + "/__seen")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var seen []string
	if err := json.NewDecoder(resp.Body).Decode(&seen); err != nil {
		t.Fatal(err)
	}
	return seen
}

// roundTrip writes raw to a fresh connection and reads one answer.
func (tg *testGateway) roundTrip(t *testing.T, raw string) (*http.Response, string) {
	t.Helper()
	c := tg.dial(t)
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to %q: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// A header whose name a CGI/WSGI upstream folds into a Fencing-*,
// X-Forwarded-*, hop-by-hop or framing name, or into one of the upstream's
// configured headers, is refused with 400 naming it, plain and TLS, and
// never reaches the upstream;
// the upstream (a real wsgiref) sees only the gateway's token.
func TestLookalikeHeadersNeverReachTheUpstream(t *testing.T) {
	up := wsgiUpstream(t)
	for _, mode := range []struct {
		name string
		tls  bool
	}{{"plain", false}, {"tls", true}} {
		t.Run(mode.name, func(t *testing.T) {
			tg := startFraming(t, up, Config{UpstreamHeaders: map[string]http.Header{"svc": {"X-Api-Key": {"gateway-secret"}}}}, mode.tls)
			lease := tg.lease(t, "r-"+mode.name)
			write := func(path, extra string) (*http.Response, string) {
				return tg.roundTrip(t, "POST /v1/proxy/svc/"+path+" HTTP/1.1\r\nHost: gw\r\nFencing-Lease: "+lease+"\r\n"+extra+"Content-Length: 1\r\n\r\nx")
			}
			resp, body := write("ok", "")
			var env map[string]string
			if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &env) != nil {
				t.Fatalf("a plain write: %d %s", resp.StatusCode, body)
			}
			if env["HTTP_FENCING_TOKEN"] != "1" || env["HTTP_FENCING_RESOURCE"] != "r-"+mode.name || env["HTTP_FENCING_LEASE"] != "" || env["HTTP_X_API_KEY"] != "gateway-secret" {
				t.Fatalf("the upstream read %v", env)
			}
			for i, h := range []string{
				"Fencing_Token: 999", "fencing_token: 999", "Fencing_Resource: evil", "FENCING_LEASE: " + lease,
				"Fencing_Anything: x", "Fencing-Anything_Else: x", "X_Forwarded_For: 6.6.6.6", "x-forwarded_host: evil",
				"X_Forwarded_Proto: https", "X_Real_Ip: 6.6.6.6", "Keep_Alive: 1", "Proxy_Connection: x",
				"Proxy_Authorization: Basic eA==", "Proxy_Authenticate: x", "X_Api_Key: mine", "x_api-KEY: mine",
				"Content_Length: 1", "Transfer_Encoding: chunked",
			} {
				resp, body := write(fmt.Sprintf("bad%d", i), h+"\r\n")
				var p problem
				if resp.StatusCode != http.StatusBadRequest || json.Unmarshal([]byte(body), &p) != nil || p.Code != tokens.CodeInvalidRequest || p.Field == "" {
					t.Errorf("%s: %d %s, want 400 invalid_request naming the header", h, resp.StatusCode, body)
					continue
				}
				if name, _, _ := strings.Cut(h, ":"); !strings.EqualFold(p.Field, name) && !strings.Contains(p.Field, "Content-Length") {
					t.Errorf("%s: field %q does not name the header", h, p.Field)
				}
			}
			if seen := wsgiSeen(t, up); slices.ContainsFunc(seen, func(p string) bool { return strings.HasPrefix(p, "/bad") }) {
				t.Fatalf("look-alikes reached the upstream: %v", seen)
			}
		})
	}
}

func TestLookalikeFold(t *testing.T) {
	for name, want := range map[string]bool{
		"Fencing_token": true, "Fencing_": true, "FENCING_X": true, "Fencing-X_y": true, "X_forwarded_for": true,
		"X_forwarded_": true, "Content_length": true, "Content_length_": false, "Transfer_encoding": true,
		"Keep_alive": true, "Proxy_connection": true, "X_real_ip": true, "X_real_ipx": false,
		"My_header": false, "Fencingx_token": false, "Fencing": false, "X_forwarded": false,
		"Fencing_" + strings.Repeat("x", 200): true,
	} {
		if got := protectedFold(name); got != want {
			t.Errorf("protectedFold(%q) = %v, want %v", name, got, want)
		}
	}
	if got := lookalikeHeader(http.Header{"Fencing-Token": nil, "X-Forwarded-For": nil, "My_header": nil}); got != "" {
		t.Errorf("names Go's rules see as they are: %q", got)
	}
}
