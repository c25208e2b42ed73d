package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencegw/fencegw/client"
)

// An acquire that waited for the resource longer than its TTL still hands
// out a live lease: the SDK counts a lease's time from the acquire's send
// (the only safe local bound for the grant), so it renews once before
// returning instead of counting the lease lost on arrival.
func TestC14AcquireThatWaitedLongerThanTheTTL(t *testing.T) {
	e := newEnv(t)
	a := e.acquire(e.client("A", nil), "stmt:acct:9", client.AcquireOptions{TTL: 2 * time.Second})
	released := make(chan error, 1)
	go func() {
		time.Sleep(3 * shortTTL) // B waits this long, several of its TTLs
		released <- a.Release(context.Background())
	}()
	start := time.Now()
	b, err := e.client("B", nil).Acquire(context.Background(), "stmt:acct:9", client.AcquireOptions{TTL: shortTTL, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("B's acquire after %v: %v", time.Since(start), err)
	}
	defer b.Close()
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited <= shortTTL {
		t.Fatalf("B's acquire returned after %v, not past its TTL: the test proves nothing", waited)
	}
	if err := b.Err(); err != nil {
		t.Fatalf("B's lease, just granted, counted as lost: %v", err)
	}
	mustWrite(t, b, "/accounts/9/lines", "B")
	// And it is renewed from there on.
	time.Sleep(2 * shortTTL)
	if err := b.Err(); err != nil {
		t.Fatalf("B's lease lost while renewing: %v", err)
	}
	mustWrite(t, b, "/accounts/9/lines", "B again")
}
