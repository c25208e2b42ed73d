package framing

import (
	"os"
	"testing"
)

// TestMain checks every list of fields taken for a header map against the
// map (VerifyLists), as the gateway's tests do.
func TestMain(m *testing.M) {
	VerifyLists = true
	os.Exit(m.Run())
}
