package tokens_test

import (
	"testing"

	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// The in-process lock (embedded mode) passes the Locker suite; one process
// is one replica, so every "replica" is the same LocalLocker.
func TestLocalLockerConformance(t *testing.T) {
	storagetest.RunLocker(t, storagetest.LockerHarness{
		Replicas: func(t *testing.T, n int) []tokens.Locker {
			l := tokens.NewLocalLocker()
			out := make([]tokens.Locker, n)
			for i := range out {
				out[i] = l
			}
			return out
		},
	})
}
