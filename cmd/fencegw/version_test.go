package main

import (
	"bytes"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// TestVersionNamesTheBuild: `fencegw version` and `fencegw --version` print
// one line naming the build and the Go version it was built with, and exit
// 0; anything after version is a usage error.
func TestVersionNamesTheBuild(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(fencegwBinary(t), args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("fencegw %s: %v, stderr %q", args[0], err, stderr.String())
		}
		out := strings.TrimSpace(stdout.String())
		if strings.Count(out, "\n") != 0 || !strings.HasPrefix(out, "fencegw ") ||
			!strings.HasSuffix(out, " "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH) {
			t.Errorf("fencegw %s printed %q; want one line: fencegw, the build, the Go version and platform", args[0], out)
		}
	}
	err := exec.Command(fencegwBinary(t), "version", "--json").Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("fencegw version --json: %v, want exit 2", err)
	}
}
