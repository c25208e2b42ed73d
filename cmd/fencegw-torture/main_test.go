package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A theft rate outside 1-1000 per mille is a bad flag (exit 2, one line
// naming it), not a silent default: 0 used to mean the default 50.
func TestTheftPermilleOutOfRange(t *testing.T) {
	for _, v := range []string{"0", "-1", "1001"} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"--theft-permille", v}, &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), "--theft-permille") {
			t.Errorf("--theft-permille %s: exit %d, stderr %q; want 2 naming the flag", v, code, stderr.String())
		}
	}
}
