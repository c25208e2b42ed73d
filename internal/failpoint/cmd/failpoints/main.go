// Command failpoints tells scripts/torture-ci.sh which broken builds to run
// and whether each run was caught for the reason internal/failpoint gives.
//
//	failpoints list              one line per break: name, torture mode, faults ("-": the mode's default)
//	failpoints caught NAME FILE  exit 1 unless FILE (fencegw-torture --json) counts a
//	                             violation of one of the rules that catch NAME
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/fencegw/fencegw/internal/failpoint"
	"github.com/fencegw/fencegw/torture"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "failpoints:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 1 && args[0] == "list":
		for _, b := range failpoint.Breaks {
			faults := b.Faults
			if faults == "" {
				faults = "-"
			}
			fmt.Println(b.Name, b.Mode, faults)
		}
		return nil
	case len(args) == 3 && args[0] == "caught":
		return caught(args[1], args[2])
	}
	return fmt.Errorf("usage: failpoints list | failpoints caught NAME REPORT.json")
}

// caught checks that a broken build's run found a violation of a rule that
// catches it: a run caught only by another rule means that either the
// failpoint's documentation or the torture changed, and someone must look.
func caught(name, file string) error {
	i := slices.IndexFunc(failpoint.Breaks, func(b failpoint.Break) bool { return b.Name == name })
	if i < 0 {
		return fmt.Errorf("no failpoint %q", name)
	}
	b := failpoint.Breaks[i]
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var out struct {
		Report torture.Report `json:"report"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	counts := out.Report.Stats.ViolationCounts
	for _, rule := range b.CaughtBy {
		if counts[rule] > 0 {
			return nil
		}
	}
	return fmt.Errorf("broken build %s: no violation of %v in %s (found %v)", name, b.CaughtBy, file, counts)
}
