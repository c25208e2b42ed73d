package gateway

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/fencegw/fencegw/tokens"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lease ids never reach a log, at any level: renewals, releases and
// lookups their clients abandon (the store call fails with the client's
// context) are logged at debug with the path's lease id cut to its hint,
// and so is a write whose upstream path holds an id.
func TestLeaseIDsNeverReachTheLog(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tg := startFraming(t, "http://127.0.0.1:1", Config{Logger: log}, false)
	lease := tg.lease(t, "r")
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/leases/" + lease + "/renew", `{"ttl_ms":60000}`},
		{"GET", "/v1/leases/" + lease, ""},
		{"DELETE", "/v1/leases/" + lease, ""},
		{"POST", "/v1/leases/" + lease + "/release", ""},
	} {
		r := httptest.NewRequestWithContext(gone, c.method, c.path, strings.NewReader(c.body))
		if c.body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		tg.g.ServeHTTP(httptest.NewRecorder(), r)
	}
	// The upstream is unreachable: an error that names the outbound URL
	// holds the path the client chose.
	r := httptest.NewRequest("POST", "/v1/proxy/svc/"+lease, strings.NewReader("x"))
	r.Header.Set(HeaderLease, lease)
	r.Header.Set("Expect", "100-continue")
	tg.g.ServeHTTP(httptest.NewRecorder(), r)
	out := logs.String()
	if !strings.Contains(out, "request abandoned by its client") || !strings.Contains(out, tokens.LeaseHint(lease)) {
		t.Fatalf("the abandoned calls were not logged with the lease's hint:\n%s", out)
	}
	if strings.Contains(out, lease) || strings.Contains(out, lease[len(lease)-12:]) {
		t.Fatalf("a lease id is in the log:\n%s", out)
	}
}

func TestRedactLeaseIDs(t *testing.T) {
	id := tokens.NewLeaseID()
	for in, want := range map[string]string{
		"/v1/leases/" + id + "/renew": "/v1/leases/" + tokens.LeaseHint(id) + "/renew",
		"/a/" + id + "/" + id:         "/a/" + tokens.LeaseHint(id) + "/" + tokens.LeaseHint(id),
		"/v1/leases/fl_":              "/v1/leases/…",
		"no id":                       "no id",
	} {
		if got := tokens.RedactLeaseIDs(in); got != want {
			t.Errorf("RedactLeaseIDs(%q) = %q, want %q", in, got, want)
		}
	}
}
