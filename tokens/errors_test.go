package tokens

import (
	"errors"
	"fmt"
	"testing"
)

// errors.Is finds an Error's kind and its cause, and nothing else; the
// kind without an allocation (every fresh resource's grant asks it).
func TestErrorIsItsKindAndCause(t *testing.T) {
	cause := errors.New("disk on fire")
	err := fmt.Errorf("read: %w", &Error{Kind: ErrStoreUnavailable, Cause: cause})
	for target, want := range map[error]bool{ErrStoreUnavailable: true, cause: true, ErrNotFound: false, errors.New("disk on fire"): false} {
		if got := errors.Is(err, target); got != want {
			t.Errorf("errors.Is(%v, %v) = %v, want %v", err, target, got, want)
		}
	}
	notFound := error(&Error{Kind: ErrNotFound, Resource: "r"})
	if n := testing.AllocsPerRun(100, func() {
		if !errors.Is(notFound, ErrNotFound) {
			t.Fatal("not found is not ErrNotFound")
		}
	}); n != 0 {
		t.Errorf("errors.Is of the kind: %v allocations, want 0", n)
	}
}
