package replica_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/fencegw/fencegw/replica"
	"github.com/fencegw/fencegw/storage/mode"
)

// A replica that fails to start after its store opened (here: its address
// is taken) closes the store again, so that the next one opens it.
func TestNewFailingClosesTheStore(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	_, err = replica.New(t.Context(), replica.Config{Mode: mode.Config{Data: dir}, Listen: taken.Addr().String()})
	var op *net.OpError
	if !errors.As(err, &op) {
		t.Fatalf("New on a taken address: %v, want the listen error", err)
	}
	r, err := replica.New(t.Context(), replica.Config{Mode: mode.Config{Data: dir}, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("the store stayed open after the failed start: %v", err)
	}
	r.Close()
}

// Shutdown drains and stops serving; Close then closes the store, which
// the next replica opens.
func TestShutdownThenReopen(t *testing.T) {
	dir := t.TempDir()
	r, err := replica.New(t.Context(), replica.Config{Mode: mode.Config{Data: dir}, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	r.Start()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.URL()+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %d", resp.StatusCode)
	}
	if err := r.Shutdown(nil); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if c, err := net.Dial("tcp", r.Addr()); err == nil {
		c.Close()
		t.Fatal("still accepting after Shutdown")
	}
	r.Close()
	r2, err := replica.New(t.Context(), replica.Config{Mode: mode.Config{Data: dir}, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("reopen after Close: %v", err)
	}
	r2.Close()
}
