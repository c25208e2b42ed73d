package gateway

import (
	"strconv"
	"testing"
)

// TestTokenStringAllocatesNothing: a write's token is written into its
// state's storage, whatever its size (strconv.FormatInt allocates for
// tokens from 100 on), and reads as FormatInt's.
func TestTokenStringAllocatesNothing(t *testing.T) {
	for _, token := range []int64{0, 7, 99, 100, 12345, 1<<63 - 1} {
		var f forward
		var got string
		allocs := testing.AllocsPerRun(100, func() { got = tokenString(&f.tokenText, token) })
		if want := strconv.FormatInt(token, 10); got != want || allocs != 0 {
			t.Fatalf("tokenString(%d) = %q in %v allocations, want %q in none", token, got, allocs, want)
		}
	}
}
