// Command list prints the deliberately broken builds, one a line: the
// failpoint's name, the torture mode that reaches it and the faults to
// inject ("-" for the mode's default), for scripts/torture-ci.sh to read.
//
//	go run ./internal/failpoint/cmd/list
package main

import (
	"fmt"

	"github.com/fencegw/fencegw/internal/failpoint"
)

func main() {
	for _, b := range failpoint.Breaks {
		faults := b.Faults
		if faults == "" {
			faults = "-"
		}
		fmt.Println(b.Name, b.Mode, faults)
	}
}
