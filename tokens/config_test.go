package tokens

import (
	"context"
	"testing"
)

// fencerStub is a Fencer that is never called: New only looks at which
// lock it was given.
type fencerStub struct{ *LocalLocker }

func (fencerStub) Hold(context.Context, string) (Verdict, error) { return Verdict{}, nil }

// A Service takes exactly one of Locker (embedded) and Fencer (replicated):
// with both, which lock a grant takes would be a guess; with neither,
// writes would go unlocked.
func TestNewWantsExactlyOneLock(t *testing.T) {
	var store Store = struct{ Store }{} // never called
	for _, c := range []struct {
		what      string
		cfg       Config
		wantPanic bool
	}{
		{"Locker", Config{Store: store, Locker: NewLocalLocker()}, false},
		{"Fencer", Config{Store: store, Fencer: fencerStub{NewLocalLocker()}}, false},
		{"both", Config{Store: store, Locker: NewLocalLocker(), Fencer: fencerStub{NewLocalLocker()}}, true},
		{"neither", Config{Store: store}, true},
		{"no Store", Config{Locker: NewLocalLocker()}, true},
	} {
		t.Run(c.what, func(t *testing.T) {
			defer func() {
				if r := recover(); (r != nil) != c.wantPanic {
					t.Fatalf("New panicked: %v; want a panic: %v", r, c.wantPanic)
				}
			}()
			New(c.cfg)
		})
	}
}
