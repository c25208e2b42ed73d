package main

import (
	"net/url"
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
