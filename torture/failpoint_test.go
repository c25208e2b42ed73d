package torture

import (
	"slices"
	"strings"
	"testing"

	"github.com/fencegw/fencegw/internal/failpoint"
)

// Every broken build names a mode, faults and rules that the torture
// knows: scripts/torture-ci.sh runs each as internal/failpoint says, and a
// rule renamed here would otherwise fail every broken build's check at CI
// time only.
func TestFailpointsNameKnownRulesModesAndFaults(t *testing.T) {
	for _, b := range failpoint.Breaks {
		faults, ok := DefaultFaults[b.Mode]
		if !ok {
			t.Errorf("%s: unknown mode %q", b.Name, b.Mode)
		}
		faults = append(slices.Clip(faults), OptInFaults[b.Mode]...)
		if b.Faults != "" {
			for f := range strings.SplitSeq(b.Faults, ",") {
				if !slices.Contains(faults, f) {
					t.Errorf("%s: fault %q is not one of the %s mode's %v (defaults and opt-in)", b.Name, f, b.Mode, faults)
				}
			}
		}
		for _, r := range b.CaughtBy {
			if !slices.Contains(Rules, r) {
				t.Errorf("%s: caught by %q, which is not a rule (%v)", b.Name, r, Rules)
			}
		}
	}
}
