package torture

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// A short embedded run through the real binary, workers in-process: the
// harness works and a correct gateway passes. scripts/torture-ci.sh runs the
// long ones, the other modes and the broken builds.
func TestSmokeEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the gateway")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "fencegw")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fencegw/fencegw/cmd/fencegw").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	res, err := Run(context.Background(), Config{
		Mode: ModeEmbedded, Binary: bin, Dir: dir, Duration: 6 * time.Second,
		WorkerGroups: 2, Goroutines: 4, FaultGap: 600 * time.Millisecond,
		Faults:    []string{FaultKillGateway, FaultPauseGateway, FaultSlowUpstream, FaultStopInWrite},
		TokenBase: DefaultTokenBase,
		// enough thefts in 6 s that the run is not void for want of one
		TheftPermille: 150,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", res.Report)
	if !res.Report.OK() {
		t.Fatalf("smoke run failed; gateway log in %s", dir)
	}
	// Kinds come in shuffled rounds; on a loaded machine 6 s may hold only
	// a few faults, so ask for faults, not for particular kinds.
	total := 0
	for _, n := range res.Report.Stats.Faults {
		total += n
	}
	if total < 2 {
		t.Errorf("%d faults in the run, want at least 2", total)
	}
}

// The seeded store file is what storage/bolt reads: grants continue above
// the seed.
func TestSeedBolt(t *testing.T) {
	dir := t.TempDir()
	if err := SeedBolt(dir, []string{"a", "b/c"}, DefaultTokenBase); err != nil {
		t.Fatal(err)
	}
	s, err := bolt.Open(filepath.Join(dir, "fencegw.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if r, err := s.Resource(ctx, "b/c"); err != nil || r.Token != DefaultTokenBase {
		t.Fatalf("seeded resource: %+v, %v", r, err)
	}
	l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "a", Holder: "t", TTL: time.Second})
	if err != nil || l.Token != DefaultTokenBase+1 {
		t.Fatalf("grant after seed: %+v, %v", l, err)
	}
}
