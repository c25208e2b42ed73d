package main

import (
	"strings"
	"testing"
	"time"
)

// --observe names configured upstreams only, from flags or FENCEGW_OBSERVES,
// and the start says which upstreams only observe.
func TestObserveFlag(t *testing.T) {
	noEnv := func(string) string { return "" }
	cfg, err := parseServe([]string{"--upstream", "a=http://127.0.0.1:1", "--upstream", "b=http://127.0.0.1:2", "--observe", "a"}, noEnv)
	if err != nil || !cfg.Observe["a"] || cfg.Observe["b"] {
		t.Fatalf("--observe a: %v %v", cfg.Observe, err)
	}
	env := map[string]string{"FENCEGW_UPSTREAMS": "a=http://127.0.0.1:1,b=http://127.0.0.1:2", "FENCEGW_OBSERVES": "a, b"}
	if cfg, err = parseServe(nil, func(k string) string { return env[k] }); err != nil || !cfg.Observe["a"] || !cfg.Observe["b"] {
		t.Fatalf("FENCEGW_OBSERVES: %v %v", cfg.Observe, err)
	}
	if cfg, err = parseServe([]string{"--upstream", "a=http://127.0.0.1:1"}, noEnv); err != nil || cfg.Observe != nil {
		t.Fatalf("default: %v %v, want every upstream enforcing", cfg.Observe, err)
	}
	if _, err := parseServe([]string{"--upstream", "a=http://127.0.0.1:1", "--observe", "c"}, noEnv); err == nil || !strings.Contains(err.Error(), `upstream "c" is not configured`) {
		t.Fatalf("--observe of an unknown upstream: %v", err)
	}

	p := startProc(t, "--data", t.TempDir(), "--upstream", "a=http://127.0.0.1:1", "--upstream", "b=http://127.0.0.1:2", "--observe", "a")
	const want = "OBSERVE ONLY, NOT FENCED"
	var out string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if out = p.output(); strings.Contains(out, "upstream b") && strings.Contains(out, "upstream a") && strings.Contains(out, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("start does not say which upstream observes:\n%s", out)
		}
	}
	_, afterA, _ := strings.Cut(out, "upstream a ->")
	if line := strings.SplitN(afterA, "\n", 3); len(line) < 2 || !strings.Contains(line[1], want+": writes under stale") {
		t.Errorf("the line under upstream a does not say it observes:\n%s", out)
	}
	if strings.Count(out, want) != 1 {
		t.Errorf("the banner says %q %d times, want once (only a observes):\n%s", want, strings.Count(out, want), out)
	}
}
