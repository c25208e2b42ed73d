package failpoint

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// guards are the package tests that catch a broken build without the
// torture: built with the break's tag, the test named here, in the package
// the break lives in (or the nearest one whose tests reach it), must fail.
// A developer who breaks a rule sees it from go test of that package.
// Breaks without an entry are caught by the torture alone (see Breaks).
var guards = map[string]struct{ pkg, run string }{
	"float_tokens":       {"./storage/bolt", "^(TestCodecRoundTrip|FuzzDecode)$"},
	"not_durable":        {"./storage/bolt", "^TestCrash$"},
	"skip_route_check":   {"./gateway", "^TestRouteRefusesALeaseForAnotherResource$"},
	"no_owner":           {"./gateway", "^TestStolenLeaseIsAttributedToThePresenter$"},
	"forget_idempotency": {"./gateway", "^TestIdempotentWriteIsReplayed$"},
	"unlock_on_timeout":  {"./gateway", "^TestIdempotentTimeoutIsNeverForwardedTwice$"},
	"no_replica_drain":   {"./storage/postgres", "^TestFenceConformance$/^CrashedReplicaDrainsOnlyItsResources$"},
	"no_send_check":      {"./gateway", "^TestFenceLost(BeforeSendSendsNothing|MidBodyNeverCompletesIt)$"},
	"drop_failed_drain":  {"./e2e", "^TestStoreRefusesDrain$"},
}

// Each guard passes in the normal build (elsewhere: the package's own
// run) and fails in its break's build. Each break compiles its package
// once more with its tag; -short skips this.
func TestBrokenBuildsFailTheirGuards(t *testing.T) {
	for name := range guards {
		if !slices.ContainsFunc(Breaks, func(b Break) bool { return b.Name == name }) {
			t.Errorf("guard for %q, which Breaks does not list", name)
		}
	}
	if testing.Short() {
		t.Skip("builds each broken build; skipped with -short")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range Breaks {
		g, ok := guards[b.Name]
		if !ok {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			cmd := exec.Command("go", "test", "-count=1", "-tags", b.Tag(), "-run", g.run, g.pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "GOFLAGS=")
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("built with %s, %s %s passed: the break is not caught there\n%s", b.Tag(), g.pkg, g.run, out)
			}
			if _, isExit := err.(*exec.ExitError); !isExit || !strings.Contains(string(out), "--- FAIL") {
				t.Fatalf("built with %s, %s %s did not run to a failing test: %v\n%s", b.Tag(), g.pkg, g.run, err, out)
			}
		})
	}
}
