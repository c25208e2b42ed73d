package storagetest

// The store suite's helpers: unique resource names, grants and releases
// that fail the test, the store's clock, error checks.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// resourceName returns a resource name unique to the test and the run.
func resourceName(t *testing.T, suffix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer(" ", "_", "#", "_").Replace(t.Name())
	return fmt.Sprintf("st/%s/%s-%s", name, suffix, hex.EncodeToString(b[:]))
}

func grant(t *testing.T, s tokens.Store, resource, holder string, ttl time.Duration) tokens.Lease {
	t.Helper()
	l, err := s.Grant(t.Context(), tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: holder, TTL: ttl})
	if err != nil {
		t.Fatalf("Grant(%s, %s): %v", resource, holder, err)
	}
	if l.Resource != resource || l.Holder != holder || l.ID == "" {
		t.Fatalf("Grant returned %+v for resource %s holder %s", l, resource, holder)
	}
	return l
}

func release(t *testing.T, s tokens.Store, l tokens.Lease) tokens.Lease {
	t.Helper()
	out, err := s.Release(t.Context(), l.ID)
	if err != nil {
		t.Fatalf("Release(token %d of %s): %v", l.Token, l.Resource, err)
	}
	return out
}

func resource(t *testing.T, s tokens.Store, name string) tokens.Resource {
	t.Helper()
	r, err := s.Resource(t.Context(), name)
	if err != nil {
		t.Fatalf("Resource(%s): %v", name, err)
	}
	if r.Name != name {
		t.Fatalf("Resource(%s).Name = %q", name, r.Name)
	}
	return r
}

// storeNow is the store's clock as it reports it, or the test's.
func storeNow(r tokens.Resource) time.Time {
	if !r.Now.IsZero() {
		return r.Now
	}
	return time.Now()
}

// wantErr checks that err wraps kind and carries *tokens.Error facts.
func wantErr(t *testing.T, err, kind error, what string) *tokens.Error {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got error %v, want %v", what, err, kind)
	}
	f := tokens.ErrorOf(err)
	if f == nil {
		t.Fatalf("%s: error %v carries no *tokens.Error", what, err)
	}
	return f
}

func near(a, b time.Time) bool {
	d := a.Sub(b)
	return -timeSlack <= d && d <= timeSlack
}

// waitExpired waits, by the store's clock, until l has expired.
func waitExpired(t *testing.T, s tokens.Store, l tokens.Lease) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		r := resource(t, s, l.Resource)
		if !storeNow(r).Before(l.ExpiresAt) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease of %s did not expire within %v", l.Resource, waitLimit)
		}
		time.Sleep(min(10*time.Millisecond, l.ExpiresAt.Sub(storeNow(r))+time.Millisecond))
	}
}
