package main

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
)

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"10MiB", "64KiB", "1", "0", "-1", "1GiB", "9223372036854775807B", "10 MB", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err == nil && (n <= 0 || n > 1<<40) {
			t.Fatalf("parseSize(%q) = %d", s, n)
		}
	})
}

func FuzzUpstreamFlag(f *testing.F) {
	for _, s := range []string{"statements=http://10.0.0.5:8080", "a=https://x/y", "=http://x", "a=ftp://x", "a", "a=http://x?q=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		u := &upstreamList{m: map[string]*url.URL{}}
		if err := u.Set(v); err == nil {
			for name, target := range u.m {
				if name == "" || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
					t.Fatalf("accepted %q as %q -> %v", v, name, target)
				}
			}
		}
	})
}

// FuzzConfigFile: whatever a --config file holds, reading it never panics,
// and a file it accepts sets only serve's flags, each from a key of its
// own name.
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		"listen: 127.0.0.1:8080\nforward-timeout: 30s\n", "upstream: [a=http://x, b=http://y]\nroute: [a/**=r*]\n",
		"upstream: a=http://x\n", "bogus: 1\n", "listen: 1\nlisten: 2\n", "- a\n- b\n", "listen: {a: b}\n",
		"observe: [a, [b]]\n", "config: x.yaml\n", "", "~\n", "log-level: !!binary aGk=\n", "&a x: *a\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := parseServe([]string{"--config", path}, func(string) string { return "" })
		if err != nil {
			if !errors.Is(err, errUsage) {
				t.Fatalf("a file's mistake is not a usage error: %v", err)
			}
			return
		}
		for name, from := range cfg.src {
			if from != "--config" && from != path+": "+name {
				t.Fatalf("%s came from %q", name, from)
			}
		}
	})
}
