package client_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/fencegw/fencegw/client"
)

// A worker writes an account's statement through the gateway under the
// account's lease.
func ExampleClient_Acquire() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:8080", client.WithHolder("worker-3"))
	if err != nil {
		log.Fatal(err)
	}
	lease, err := c.Acquire(ctx, "stmt:acct:88213", client.AcquireOptions{TTL: 10 * time.Second, Wait: 30 * time.Second})
	if errors.Is(err, client.ErrLeaseHeld) {
		return // another worker has it
	} else if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = lease.Close() }()

	// lease.Context() ends when the lease is lost: a courtesy, not a guarantee.
	req, _ := http.NewRequestWithContext(lease.Context(), http.MethodPost,
		"http://statements/accounts/88213/statement/lines", strings.NewReader("2026-11-30  closing balance  3,458.90"))
	resp, err := lease.Do(req)
	switch {
	case errors.Is(err, client.ErrStale):
		log.Printf("a newer worker holds the account; nothing was written: %v", err)
		return
	case err != nil:
		log.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	log.Printf("statement written under token %d: %s", lease.Token(), resp.Status)
}
