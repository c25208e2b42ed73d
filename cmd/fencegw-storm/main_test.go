package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets the test binary play the storm generator, as the real
// binary does when it runs itself with -generate.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-generate" {
		os.Exit(generate(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// A short run against the real gateway binary: every phase is measured, the
// storm's stale writes are refused (counted from the gateway's metrics) and
// the dashboard answered. No timing is asserted.
func TestShortStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the gateway")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "fencegw")
	build := exec.Command("go", "build", "-o", bin, "github.com/fencegw/fencegw/cmd/fencegw")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	jsonOut := filepath.Join(dir, "storm.json")
	var stdout, stderr bytes.Buffer
	code := run([]string{"-gateway-bin", bin, "-phase", "500ms", "-rounds", "1", "-rates", "300", "-storm-nice", "0", "-json", jsonOut}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	var phases []phaseResult
	b, err := os.ReadFile(jsonOut)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &phases); err != nil {
		t.Fatal(err)
	}
	if len(phases) != 2 || phases[0].TargetRate != 0 || phases[1].TargetRate != 300 {
		t.Fatalf("phases: %+v", phases)
	}
	for _, p := range phases {
		if p.HolderWrites == 0 || p.DashErrors != 0 {
			t.Fatalf("phase %+v: no holder writes or dashboard errors", p)
		}
	}
	if phases[0].StaleRefused != 0 || phases[1].StaleRefused == 0 {
		t.Fatalf("stale refusals: %d without a storm, %d with one", phases[0].StaleRefused, phases[1].StaleRefused)
	}
	if !strings.Contains(stdout.String(), "storm 300/s (achieved") {
		t.Fatalf("no summary line:\n%s", stdout.String())
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-rates", "0"}, {"-rates", "x"}, {"-phase", "0s"}, {"-phase", "1h"}, {"-rounds", "0"}, {"-storm-nice", "20"}, {"-storm-workers", "0"}} {
		var stderr bytes.Buffer
		if code := run(args, &bytes.Buffer{}, &stderr); code != 2 || stderr.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a reason", args, code, stderr.String())
		}
	}
}
