package replica_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/replica"
	"github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/tokens"
)

// logBuffer is a log's output, written from any goroutine.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// drainsAtReopen opens the embedded mode in dir again and reports whether
// resource is closed to grants (its DrainUntil ahead), as recovery leaves
// a resource whose writes may still have been in flight.
func drainsAtReopen(t *testing.T, dir, resource string) bool {
	t.Helper()
	m, err := mode.OpenEmbedded(mode.Config{Data: dir, DrainPeriod: time.Minute})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer m.Close()
	st, err := m.Store.Resource(t.Context(), resource)
	if err != nil {
		t.Fatalf("resource %s after reopen: %v", resource, err)
	}
	return st.DrainUntil.After(time.Now())
}

// A replica closed while a fenced write still holds its fence leaves the
// embedded file unmarked: the next open drains the write's resource as
// after a crash, since the process may exit with the write half-forwarded.
// A replica closed with nothing in flight is marked clean and drains
// nothing.
func TestCloseWithWriteInFlightDrainsAtReopen(t *testing.T) {
	for _, inFlight := range []bool{true, false} {
		dir := t.TempDir()
		var log logBuffer
		r, err := replica.New(t.Context(), replica.Config{Mode: mode.Config{Data: dir}, Listen: "127.0.0.1:0",
			Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatal(err)
		}
		svc := r.Service()
		l, err := svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: "r", Holder: "A", TTL: time.Minute})
		if err != nil {
			r.Close()
			t.Fatal(err)
		}
		permit, err := svc.Admit(t.Context(), l.ID, tokens.Write{Method: http.MethodPost, Upstream: "svc", Path: "/x"})
		if err != nil {
			r.Close()
			t.Fatal(err)
		}
		if !inFlight {
			permit.Done(tokens.OutcomeKnown)
		}
		r.Close()
		if inFlight {
			permit.Done(tokens.OutcomeKnown) // the old process's lock, gone with it
		}
		if got := drainsAtReopen(t, dir, "r"); got != inFlight {
			t.Errorf("closed with a write in flight: %v; the reopened store drains the resource: %v, want %v", inFlight, got, inFlight)
		}
		if said := strings.Contains(log.String(), "writes_in_flight=1"); said != inFlight {
			t.Errorf("closed with a write in flight: %v; the close logged writes_in_flight=1: %v\n%s", inFlight, said, log.String())
		}
	}
}
