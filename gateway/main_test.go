package gateway

import (
	"os"
	"testing"

	"github.com/fencegw/fencegw/gateway/internal/framing"
)

// TestMain has every list of fields the road takes for a header map
// checked against the map (framing.VerifyLists): a handler or middleware
// that changed a header in place, unseen by the count the road compares,
// fails the test that served it.
func TestMain(m *testing.M) {
	framing.VerifyLists = true
	os.Exit(m.Run())
}
