package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// --allowed-hosts (or FENCEGW_ALLOWED_HOSTS) names the gateway; without it
// a loopback gateway answers to the loopback names and its address, and a
// non-loopback one has no Host check and says so at start.
func TestAllowedHosts(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		env  string
		want string // "" : no check
	}{
		{[]string{"--listen", "127.0.0.1:8080"}, "", "localhost,127.0.0.1,::1"},
		{[]string{"--listen", "127.0.0.1:8080", "--allowed-hosts", "gw.local"}, "", "localhost,127.0.0.1,::1,gw.local"},
		{[]string{"--listen", "0.0.0.0:8080", "--insecure-no-auth"}, "", ""},
		{[]string{"--listen", "0.0.0.0:8080", "--insecure-no-auth", "--allowed-hosts", "gw.example.com, gw2.example.com:443"}, "", "localhost,127.0.0.1,::1,gw.example.com,gw2.example.com:443"},
		{[]string{"--listen", "10.0.0.5:8080", "--insecure-no-auth"}, "gw.example.com", "localhost,127.0.0.1,::1,gw.example.com,10.0.0.5"},
		{[]string{"--listen", "127.0.0.1:8080", "--allowed-hosts", "*"}, "", ""},
	} {
		getenv := noEnv
		if tc.env != "" {
			getenv = func(k string) string {
				if k == "FENCEGW_ALLOWED_HOSTS" {
					return tc.env
				}
				return ""
			}
		}
		cfg, err := parseServe(tc.args, getenv)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if got := strings.Join(cfg.AllowedHosts, ","); got != tc.want {
			t.Errorf("%q env %q: allowed %q, want %q", tc.args, tc.env, got, tc.want)
		}
	}
	for _, bad := range []string{"gw/x", "a b", "*.example.com", "user@gw"} {
		if _, err := parseServe([]string{"--allowed-hosts", bad}, noEnv); err == nil || !strings.Contains(err.Error(), "allowed-hosts") {
			t.Errorf("--allowed-hosts %q: %v", bad, err)
		}
	}
}

func TestHostCheckAtStart(t *testing.T) {
	says := func(p *proc, want string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(p.output(), want); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("start does not say %q:\n%s", want, p.output())
			}
		}
	}
	p := startProc(t, "--data", t.TempDir(), "--listen", "0.0.0.0:0", "--insecure-no-auth")
	says(p, "Host check: off: --listen 0.0.0.0:0 is not a loopback address and there is no --allowed-hosts")
	p = startProc(t, "--data", t.TempDir())
	says(p, "Host check: localhost, 127.0.0.1, ::1\n") // each name once
	// The real binary refuses a foreign Host and takes its own.
	for host, want := range map[string]int{"rebind.evil.example": 403, "": 200} {
		req, _ := http.NewRequest("GET", p.url()+"/v1/rejections", nil)
		if host != "" {
			req.Host = host
		}
		c := &http.Client{Timeout: 10 * time.Second}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %q: %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// --route (FENCEGW_ROUTES) binds upstreams; a route for an unknown
// upstream or a malformed one is a usage error naming it.
func TestRouteFlag(t *testing.T) {
	env := map[string]string{"FENCEGW_ROUTES": "st/accounts/{acct}/**=stmt:acct:{acct}, st/admin/**=ops:*"}
	cfg, err := parseServe([]string{"--upstream", "st=http://127.0.0.1:1"}, func(k string) string { return env[k] })
	if err != nil || len(cfg.Routes) != 2 || cfg.Routes[1].String() != "st/admin/**=ops:*" {
		t.Fatalf("%+v %v", cfg.Routes, err)
	}
	cfg, err = parseServe([]string{"--upstream", "st=http://127.0.0.1:1", "--route", "st/a/{x}=r:{x}"}, func(k string) string { return env[k] })
	if err != nil || len(cfg.Routes) != 1 {
		t.Fatalf("the flag wins over the environment: %+v %v", cfg.Routes, err)
	}
	for args, msg := range map[string]string{
		"--route nope/a=r":       `upstream "nope" is not configured`,
		"--route st/a/{x}=r:{y}": "does not capture",
		"--route st/**/a=r":      "last segment",
	} {
		_, err := parseServe(append([]string{"--upstream", "st=http://127.0.0.1:1"}, strings.Fields(args)...), func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v, want %q", args, err, msg)
		}
	}
}
