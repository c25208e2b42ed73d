package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fencegw/fencegw/auth"
)

func TestServeRefusesOpenListenerWithoutAuth(t *testing.T) {
	dir := t.TempDir()
	authFile := filepath.Join(dir, "auth.yaml")
	data := "keys:\n  - {name: w, sha256: " + auth.Hash("k") + ", role: worker}\n" +
		"upstreams:\n  - {upstream: s, headers: {Authorization: Bearer x}}\n"
	if err := os.WriteFile(authFile, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--listen", "127.0.0.1:0"}, true},
		{[]string{"--listen", "[::1]:0"}, true},
		{[]string{"--listen", "localhost:8080"}, true},
		{[]string{"--listen", ":8080"}, false},
		{[]string{"--listen", "0.0.0.0:8080"}, false},
		{[]string{"--listen", "10.1.2.3:8080"}, false},
		{[]string{"--listen", "gateway.internal:8080"}, false},
		{[]string{"--listen", ":8080", "--insecure-no-auth"}, true},
		{[]string{"--listen", ":8080", "--auth-file", authFile, "--upstream", "s=http://127.0.0.1:9"}, true},
		// credentials for an upstream that is not configured
		{[]string{"--listen", ":8080", "--auth-file", authFile}, false},
		{[]string{"--auth-file", filepath.Join(dir, "missing.yaml")}, false},
		{[]string{"--tls-cert", authFile}, false},
		{[]string{"--tls-cert", authFile, "--tls-key", authFile}, false},
	} {
		cfg, err := parseServe(tc.args, env)
		if tc.ok != (err == nil) {
			t.Errorf("parseServe(%q) = %v; want ok %v", tc.args, err, tc.ok)
		}
		if err != nil && !errors.Is(err, errUsage) {
			t.Errorf("parseServe(%q): %v is not a usage error (exit 2)", tc.args, err)
		}
		if err == nil && slices.Contains(tc.args, "--auth-file") && (cfg.Auth == nil || cfg.Auth.Keys.Len() != 1) {
			t.Errorf("parseServe(%q): auth file not loaded", tc.args)
		}
	}
}

func TestHashKey(t *testing.T) {
	var out strings.Builder
	if err := hashKey(strings.NewReader("fgk_abc\n"), &out); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != auth.Hash("fgk_abc") {
		t.Fatalf("hash-key printed %q", got)
	}
	if err := hashKey(strings.NewReader(""), &out); !errors.Is(err, errUsage) {
		t.Fatalf("hash-key of nothing: %v", err)
	}
}
