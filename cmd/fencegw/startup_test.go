package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// Every startup mistake ends the real binary with one line on stderr that
// names the flag, variable or file key as the user wrote it and says what
// is wrong: exit 2 for a bad value, 1 for a store that cannot be reached
// (named with its address, its password hidden, once, within a bound).
func TestStartupErrorsNameTheirCause(t *testing.T) {
	refused := "127.0.0.1:" + strconv.Itoa(freePort(t)) // nothing listens there
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() }) // after the parallel cases
	// silent accepts connections and never answers them.
	go func() {
		var held []net.Conn
		for {
			c, err := silent.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	dir := t.TempDir()
	conf := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(conf, []byte("upstream:\n  - a=http://127.0.0.1:1\n  - b=ftp://example.com\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	held := startProc(t, "--data", filepath.Join(dir, "held"))

	type tc struct {
		name string
		args []string
		env  []string
		code int
		want []string // all in the one line
		not  []string // none anywhere
	}
	cases := []tc{
		{"postgres not a URL", []string{"--postgres", "127.0.0.1:5432"}, nil, 2, []string{"--postgres: ", "not a URL", "postgres://"}, nil},
		{"postgres variable", nil, []string{"FENCEGW_POSTGRES=127.0.0.1:5432"}, 2, []string{"FENCEGW_POSTGRES: ", "not a URL"}, nil},
		{"sslmode", []string{"--postgres", "postgres://u:hunter2@127.0.0.1:5432/test?sslmode=bogus"}, nil, 2, []string{"--postgres: ", "sslmode"}, []string{"hunter2", "invalid request"}},
		{"postgres refuses", []string{"--postgres", "postgres://u:hunter2@" + refused + "/test"}, nil, 1,
			[]string{"--postgres ", "cannot reach PostgreSQL at " + refused, "connection refused"}, []string{"hunter2"}},
		{"postgres never answers", []string{"--postgres", "postgres://u:hunter2@" + silent.Addr().String() + "/test"}, nil, 1,
			[]string{"cannot reach PostgreSQL at " + silent.Addr().String(), "no answer within the connect timeout"}, []string{"hunter2"}},
		{"upstream with credentials", []string{"--upstream", "a=http://user:hunter2@127.0.0.1:9"}, nil, 2, []string{"--upstream: ", `upstream "a"`, "may not hold credentials", "auth file"}, []string{"hunter2"}},
		{"upstream not http, with credentials", []string{"--upstream", "a=ftp://user:hunter2@127.0.0.1:9"}, nil, 2, []string{"--upstream: ", "not an http(s) URL", "user:xxxxx@"}, []string{"hunter2"}},
		{"data empty", []string{"--data", ""}, nil, 2, []string{"--data: ", "must not be empty"}, nil},
		{"data cannot be created", []string{"--data", "/proc/fencegw-nope/data"}, nil, 1,
			[]string{"--data /proc/fencegw-nope/data: ", "cannot create the directory", "mkdir /proc/fencegw-nope"}, nil},
		{"listen port out of range", []string{"--listen", "127.0.0.1:99999"}, nil, 2, []string{"--listen: ", "127.0.0.1:99999", "out of range"}, []string{"invalid port"}},
		{"listen port variable", nil, []string{"FENCEGW_LISTEN=127.0.0.1:http-alt-nope"}, 2, []string{"FENCEGW_LISTEN: ", "not a port number"}, nil},
		{"listen a port alone", []string{"--listen", "18130"}, nil, 2, []string{"--listen: ", "a port alone", "127.0.0.1:18130"}, []string{"loopback"}},
		{"redis not a URL", []string{"--redis", "127.0.0.1:6379", "--postgres", "postgres://u@127.0.0.1/test"}, nil, 2, []string{"--redis: ", "not a URL", "redis://"}, nil},
		{"log level", []string{"--log-level", "verbose"}, nil, 2, []string{"--log-level: ", "debug, info, warn or error"}, nil},
		{"duration without a unit", []string{"--forward-timeout", "30"}, nil, 2, []string{"--forward-timeout: ", "a duration needs a unit, e.g. 30s"}, nil},
		{"duration variable", nil, []string{"FENCEGW_GRANT_WAIT=10"}, 2, []string{"FENCEGW_GRANT_WAIT: ", "needs a unit"}, nil},
		{"unknown flag", []string{"--bogus"}, nil, 2, []string{"--bogus", "see fencegw serve --help"}, []string{" -bogus"}},
		{"flag without its value", []string{"--data"}, nil, 2, []string{"--data needs a value", "see fencegw serve --help"}, nil},
		{"config file", []string{"--config", conf}, nil, 2, []string{conf + ": upstream[1]: ", "ftp://example.com"}, nil},
		{"data in use", []string{"--data", filepath.Join(dir, "held")}, nil, 2,
			[]string{"--data: ", "is in use by another process (pid " + strconv.Itoa(held.cmd.Process.Pid) + ")"}, []string{"timeout"}},
	}
	if os.Getenv("CI") == "true" || pgReachable() {
		cases = append(cases, tc{"redis unreachable", []string{"--postgres", pgtest.URL(), "--pg-schema", pgtest.NewSchema(t), "--redis", "redis://:hunter2@" + refused + "/0"}, nil, 1,
			[]string{"--redis ", "cannot reach Redis at " + refused, "connection refused"}, []string{"hunter2", "pool.go", "redis: 20"}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(fencegwBinary(t), append([]string{"serve", "--shutdown-delay", "0"}, c.args...)...)
			cmd.Env = append(os.Environ(), c.env...)
			cmd.Dir = t.TempDir()
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
			out := strings.TrimSpace(stderr.String())
			if code != c.code || strings.Count(out, "\n") != 0 {
				t.Fatalf("exit %d with %q; want exit %d and one line", code, stderr.String(), c.code)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("%q does not say %q", out, w)
				}
			}
			for _, n := range c.not {
				if strings.Contains(out+stdout.String(), n) {
					t.Errorf("%q says %q", out+stdout.String(), n)
				}
			}
		})
	}
}

// pgReachable: the Redis case needs a PostgreSQL to get as far as Redis
// (pgtest.Require fails the test under CI=true without one).
func pgReachable() bool {
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(strings.SplitN(strings.TrimPrefix(pgtest.URL(), "postgres://"), "/", 2)[0], "postgres@"), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// fencegw config check reads a file as serve would, and serves nothing:
// exit 0 and a summary for a good one, 2 and one line for a bad one.
func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("upstream: [a=http://127.0.0.1:1]\nroute: [a/**=r*]\nforward-timeout: 5s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("upstream: [a=http://127.0.0.1:1]\nwaitms: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file string
		code int
		want string
	}{
		{good, 0, good + ": ok (1 upstreams, 1 routes)"},
		{bad, 2, bad + ": line 2: waitms is not a setting"},
	} {
		cmd := exec.Command(fencegwBinary(t), "config", "check", c.file)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != c.code || !strings.Contains(string(out), c.want) || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
			t.Errorf("config check %s: exit %d, %q; want %d and one line with %q", c.file, code, out, c.code, c.want)
		}
	}
}

// Flags win over FENCEGW_* variables, which win over the --config file;
// the file fills in the rest, lists for repeatable flags.
func TestConfigFilePrecedence(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(conf, []byte(`listen: 127.0.0.1:1111
forward-timeout: 7s
grant-wait: 3s
max-body: 1MiB
upstream: [a=http://127.0.0.1:1, b=http://127.0.0.1:2]
observe: b
`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"FENCEGW_FORWARD_TIMEOUT": "8s", "FENCEGW_GRANT_WAIT": "4s"}
	cfg, err := parseServe([]string{"--config", conf, "--grant-wait", "5s"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:1111" || cfg.ForwardTimeout != 8*time.Second || cfg.GrantWait != 5*time.Second ||
		cfg.MaxBody != 1<<20 || len(cfg.Upstreams) != 2 || !cfg.Observe["b"] {
		t.Fatalf("config: %+v", cfg)
	}
	if cfg.src.of("listen") != conf+": listen" || cfg.src.of("forward-timeout") != "FENCEGW_FORWARD_TIMEOUT" || cfg.src.of("grant-wait") != "--grant-wait" {
		t.Fatalf("sources: %v", cfg.src)
	}
}
