package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
)

// A call its client abandoned (a renewal the SDK cancelled) is not a
// server error: logged at debug, never at error. The same failure with the
// client still waiting is logged as an error.
func TestAbandonedRequestIsNotAnError(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	failure := fmt.Errorf("renew: %w", context.Canceled)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, "POST", "/v1/leases/fl_x/renew", nil)
	writeProblem(httptest.NewRecorder(), r, log, failure)
	if out := buf.String(); strings.Contains(out, "level=ERROR") || !strings.Contains(out, "level=DEBUG") {
		t.Errorf("an abandoned call was logged as:\n%s", out)
	}

	buf.Reset()
	r = httptest.NewRequest("POST", "/v1/leases/fl_x/renew", nil)
	writeProblem(httptest.NewRecorder(), r, log, errors.New("disk on fire"))
	if out := buf.String(); !strings.Contains(out, "level=ERROR") {
		t.Errorf("an internal error with the client waiting was logged as:\n%s", out)
	}
}
