package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/auth"
	"github.com/fencegw/fencegw/internal/testcert"
)

// reloadSet is one of two consistent configurations the test swaps
// between: its own upstream, which answers with the set's name, its own
// credential header for that upstream, its own route and its own viewer
// key; a worker key common to both.
type reloadSet struct {
	name     string // "A" or "B"
	upstream *httptest.Server
	viewer   string // a key only this set has
	conf     string // the configuration file
}

// setUpstream answers writes with its set's name, and counts a request
// that carries the other set's credential or comes to the other set's
// route: a request judged under a mix of the two.
func setUpstream(t *testing.T, name string, mixed *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		other := map[string]string{"A": "B", "B": "A"}[name]
		if r.Header.Get("X-Set") != name || strings.Contains(r.URL.Path, "/only-"+strings.ToLower(other)+"/") {
			mixed.Add(1)
		}
		time.Sleep(2 * time.Millisecond) // keep some writes in flight across each swap
		_, _ = io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// writeSet writes set s's auth and configuration files into dir.
func writeSet(t *testing.T, dir string, s *reloadSet, worker string) {
	t.Helper()
	authFile := filepath.Join(dir, "auth-"+s.name+".yaml")
	authYAML := fmt.Sprintf(`keys:
  - {name: worker, sha256: %s, role: worker}
  - {name: viewer-%s, sha256: %s, role: viewer}
upstreams:
  - upstream: up
    headers: {X-Set: %s}
`, auth.Hash(worker), s.name, auth.Hash(s.viewer), s.name)
	if err := os.WriteFile(authFile, []byte(authYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	s.conf = filepath.Join(dir, "conf-"+s.name+".yaml")
	conf := fmt.Sprintf(`# set %s
upstream:
  - up=%s
route: [up/w/**=r*, up/only-%s/**=r*]
auth-file: %s
drain-period: 100ms
`, s.name, s.upstream.URL, strings.ToLower(s.name), authFile)
	if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
}

// point swaps the symlink link to target atomically, as Kubernetes swaps
// a mounted ConfigMap.
func point(t *testing.T, link, target string) {
	t.Helper()
	tmp := link + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// A running gateway reloads its configuration 50 times, between two
// consistent sets of upstreams, credentials, routes and keys, while
// writers write: not one write fails, each is answered by one set's
// upstream with that set's credential and route, and keys change with
// the set. A broken file then changes nothing.
func TestReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	var mixed atomic.Int64
	worker := auth.GenerateKey()
	sets := []*reloadSet{
		{name: "A", upstream: setUpstream(t, "A", &mixed), viewer: auth.GenerateKey()},
		{name: "B", upstream: setUpstream(t, "B", &mixed), viewer: auth.GenerateKey()},
	}
	for _, s := range sets {
		writeSet(t, dir, s, worker)
	}
	link := filepath.Join(dir, "config.yaml")
	point(t, link, sets[0].conf)
	p := startProc(t, "--config", link, "--data", t.TempDir())
	base := p.url()
	bearer := func(key string) []string { return []string{"Authorization", "Bearer " + key} }

	// judgedBy is the set whose keys the gateway takes now (each set's
	// viewer key works only under it), asked with one request per key:
	// "" while a reload falls between the two.
	judgedBy := func() string {
		var found []string
		for _, s := range sets {
			req, _ := http.NewRequest("GET", base+"/v1/rejections", nil)
			req.Header.Set("Authorization", "Bearer "+s.viewer)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				found = append(found, s.name)
			}
		}
		if len(found) != 1 {
			return ""
		}
		return found[0]
	}
	if got := judgedBy(); got != "A" {
		t.Fatalf("at start the gateway takes set %q's keys, want A", got)
	}

	const writers = 4
	var (
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		mu       sync.Mutex
		answered = map[string]int{}
		failures []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 10 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	for i := range writers {
		code, body := post(t, base+"/v1/leases", map[string]any{"resource": fmt.Sprintf("r%d", i), "holder": "w", "ttl_ms": 600_000}, bearer(worker)...)
		if code != http.StatusCreated {
			t.Fatalf("acquire: %d %s", code, body)
		}
		var l lease
		if err := json.Unmarshal(body, &l); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{}
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				// Every other write probes the set's own route: set A
				// forwards /only-a/ to A's upstream, set B refuses it.
				path, probe := "/v1/proxy/up/w/x", n%2 == 1
				if probe {
					path = "/v1/proxy/up/only-a/x"
				}
				var resp *http.Response
				var got []byte
				if i%2 == 0 {
					req, _ := http.NewRequest("POST", base+path, strings.NewReader("x"))
					req.Header.Set("Authorization", "Bearer "+worker)
					req.Header.Set("Fencing-Lease", l.LeaseID)
					var err error
					if resp, err = client.Do(req); err != nil {
						fail("write: %v", err)
						return
					}
					got, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
				} else {
					// The head now, the body a moment later: the write is
					// judged when its head comes and forwarded after its
					// body, with reloads in between.
					var err error
					if resp, got, err = slowWrite(p.addr, path, worker, l.LeaseID); err != nil {
						fail("write: %v", err)
						return
					}
				}
				switch {
				case resp.StatusCode == http.StatusOK && (string(got) == "A" || string(got) == "B" && !probe):
					mu.Lock()
					answered[string(got)]++
					mu.Unlock()
				case probe && resp.StatusCode == http.StatusForbidden && bytes.Contains(got, []byte("resource_mismatch")):
					mu.Lock()
					answered["B-route"]++
					mu.Unlock()
				default:
					fail("POST %s: %d %s", path, resp.StatusCode, got)
				}
			}
		}()
	}

	const reloads = 50
	for i := range reloads {
		next := sets[(i+1)%2]
		point(t, link, next.conf)
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for judgedBy() != next.name {
			if time.Now().After(deadline) {
				t.Fatalf("reload %d: set %s's keys not taken after 10s\n%s", i, next.name, p.output())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("writes failed across reloads: %q", failures)
	}
	if n := mixed.Load(); n > 0 {
		t.Fatalf("%d writes reached an upstream with the other set's credential or route", n)
	}
	t.Logf("answered: %v", answered)
	if answered["A"] == 0 || answered["B"] == 0 || answered["B-route"] == 0 {
		t.Fatalf("writes were not judged under both sets: %v", answered)
	}

	// A broken file is refused in one line; the configuration in use stays.
	before := judgedBy() // A after an even number of swaps from A
	viewer := sets[0].viewer
	if before == "B" {
		viewer = sets[1].viewer
	}
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(broken, []byte("upstream: [up=http://127.0.0.1:1]\nroutes: [up/**=r*]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	point(t, link, broken)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, p, "routes is not a setting")
	if got := judgedBy(); got != before {
		t.Fatalf("after a broken file the keys of set %q are taken, want %q", got, before)
	}
	metrics := getBody(t, base+"/metrics", bearer(viewer)...)
	if !strings.Contains(metrics, `fencegw_config_reloads_total{result="error"} `) || strings.Contains(metrics, `fencegw_config_reloads_total{result="error"} 0`) {
		t.Fatalf("no refused reload counted:\n%s", grepLines(metrics, "fencegw_config_reloads_total"))
	}
	for _, line := range strings.Split(p.output(), "\n") {
		if strings.Contains(line, "reload refused") && !strings.Contains(line, "config.yaml: line 2: routes is not a setting") {
			t.Fatalf("the refusal does not name the key and its line: %s", line)
		}
	}
}

// A certificate renewed on disk is served to new TLS connections after a
// reload.
func TestReloadRotatesCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	install := func(c testcert.Cert) {
		for path, data := range map[string][]byte{certFile: c.CertPEM, keyFile: c.KeyPEM} {
			if err := os.WriteFile(path+".new", data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(path+".new", path); err != nil {
				t.Fatal(err)
			}
		}
	}
	first, second := testcert.New(t), testcert.New(t)
	install(first)
	p := startProc(t, "--tls-cert", certFile, "--tls-key", keyFile, "--data", t.TempDir())
	served := func() []byte {
		conn, err := tls.Dial("tcp", p.addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test compares the certificate itself
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Raw
	}
	if !bytes.Equal(served(), first.TLS.Certificate[0]) {
		t.Fatal("the first certificate is not served")
	}
	install(second)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !bytes.Equal(served(), second.TLS.Certificate[0]) {
		if time.Now().After(deadline) {
			t.Fatalf("the renewed certificate is not served after 10s\n%s", p.output())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// slowWrite sends a one-byte fenced write whose body follows its head by
// a few milliseconds, on a connection of its own.
func slowWrite(addr, path, key, leaseID string) (*http.Response, []byte, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	head := "POST " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer " + key +
		"\r\nFencing-Lease: " + leaseID + "\r\nContent-Length: 1\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(conn, head); err != nil {
		return nil, nil, err
	}
	time.Sleep(3 * time.Millisecond)
	if _, err := io.WriteString(conn, "x"); err != nil {
		return nil, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func waitOutput(t *testing.T, p *proc, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.output(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the output after 10s:\n%s", want, p.output())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func getBody(t *testing.T, url string, header ...string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return string(data)
}

func grepLines(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// A configuration file replaced under the gateway (a Kubernetes ConfigMap's
// symlink swap), with no signal, is reloaded; what cannot change in place
// is named in one line and kept.
func TestReloadOnReplacedFile(t *testing.T) {
	dir := t.TempDir()
	confA, confB := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	if err := os.WriteFile(confA, []byte("upstream: [a=http://127.0.0.1:1]\nforward-timeout: 30s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(confB, []byte("upstream: [b=http://127.0.0.1:1]\nforward-timeout: 20s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "config.yaml")
	point(t, link, confA)
	p := startProc(t, "--config", link, "--data", t.TempDir())
	status := func(upstream string) int {
		resp, err := http.Post(p.url()+"/v1/proxy/"+upstream+"/x", "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if status("b") != http.StatusNotFound || status("a") == http.StatusNotFound {
		t.Fatal("at start upstream a is not the only one")
	}
	point(t, link, confB)
	deadline := time.Now().Add(10 * time.Second)
	for status("b") == http.StatusNotFound {
		if time.Now().After(deadline) {
			t.Fatalf("the replaced file was not reloaded within 10s\n%s", p.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if status("a") != http.StatusNotFound {
		t.Fatal("upstream a is still configured after the reload")
	}
	waitOutput(t, p, `settings="forward-timeout, drain-period"`) // the drain period follows the forward timeout
	if !strings.Contains(p.output(), `why="a file was replaced"`) {
		t.Fatalf("the reload does not say why:\n%s", p.output())
	}
}

// Every field of config is either applied by a reload or named as one
// that cannot change in place: a new flag must be classified.
func TestEveryConfigFieldIsClassified(t *testing.T) {
	known := map[string]bool{}
	for _, f := range reloadedFields {
		known[f] = true
	}
	for _, s := range fixedSettings {
		if known[s.field] {
			t.Errorf("%s is both reloaded and fixed", s.field)
		}
		known[s.field] = true
	}
	typ := reflect.TypeOf(config{})
	for i := range typ.NumField() {
		if name := typ.Field(i).Name; !known[name] {
			t.Errorf("config.%s is neither in reloadedFields nor in fixedSettings (reload.go)", name)
		}
		delete(known, typ.Field(i).Name)
	}
	for name := range known {
		t.Errorf("%s is classified but is not a field of config", name)
	}
}
