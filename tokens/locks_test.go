package tokens

import (
	"context"
	"testing"
)

// The lock's properties are the Locker suite's (storage/storagetest,
// locker_conformance_test.go); what is left here is LocalLocker's own
// promise: memory follows the busy resources, so an entry is gone once no
// one holds or waits for it, whichever way the wait ended.
func TestLocalLockerForgetsIdleResources(t *testing.T) {
	l := NewLocalLocker()
	ctx := t.Context()
	unlockR, err := l.Shared(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Exclusive(cancelled, "r"); err == nil {
		t.Fatal("exclusive lock taken while a shared one is held")
	}
	unlockX, err := l.Exclusive(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Shared(cancelled, "x"); err == nil {
		t.Fatal("shared lock taken while an exclusive one is held")
	}
	l.mu.Lock()
	if n := len(l.entries); n != 2 {
		t.Errorf("%d entries while two resources are held, want 2", n)
	}
	l.mu.Unlock()
	unlockR()
	unlockR()
	unlockX()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) != 0 {
		t.Fatalf("entries left behind: %d", len(l.entries))
	}
}

func BenchmarkLocalLockerShared(b *testing.B) {
	l := NewLocalLocker()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			u, _ := l.Shared(ctx, "hot")
			u()
		}
	})
}
