package gateway

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// Once ShuttingDown is called, /readyz answers 503 shutting_down (with
// Retry-After) and the rest of the API answers as before.
func TestReadyzShuttingDown(t *testing.T) {
	store, err := bolt.Open(t.TempDir()+"/fencegw.db", bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	g := New(tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: log}), Config{Logger: log})
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)

	if resp, body := get(t, srv.URL+"/readyz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz before: %d %s", resp.StatusCode, body)
	}
	g.ShuttingDown()
	resp, body := get(t, srv.URL+"/readyz")
	var p struct {
		Code   string `json:"code"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal(body, &p); err != nil || resp.StatusCode != http.StatusServiceUnavailable || p.Code != problems.CodeShuttingDown ||
		resp.Header.Get("Content-Type") != problemContentType || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("/readyz while shutting down: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if resp, body := get(t, srv.URL+"/healthz"); resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz while shutting down: %d %s", resp.StatusCode, body)
	}
	if resp, body := get(t, srv.URL+"/v1/"); resp.StatusCode != http.StatusOK {
		t.Errorf("/v1/ while shutting down: %d %s", resp.StatusCode, body)
	}
}
