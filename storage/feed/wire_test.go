package feed

import (
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// Rejections packed into feed payloads come back whole and in order, each
// payload within its bound (unless one rejection alone is larger).
func FuzzRejectionFeed(f *testing.F) {
	f.Add("stmt:acct:1", "worker-3\n<script>", "/lines\r\n", 3, 7900)
	f.Add("", "", "", 1, 10)
	f.Fuzz(func(t *testing.T, resource, holder, path string, n, max int) {
		n = 1 + abs(n)%50
		max = 1 + abs(max)%9000
		at := time.Date(2026, 11, 30, 0, 41, 52, 0, time.UTC)
		var rs []tokens.Rejection
		for i := range n {
			rs = append(rs, tokens.Rejection{ID: int64(i + 1), At: at, Resource: resource, Code: tokens.CodeStaleToken, Token: int64(i), CurrentToken: 1 << 60,
				Holder: holder, Method: "POST", Upstream: "up", Path: path})
		}
		payloads, err := EncodeRejections(rs, max)
		if err != nil {
			t.Skip("not encodable:", err) // invalid UTF-8 is replaced, not refused; nothing else fails
		}
		var got []tokens.Rejection
		for _, p := range payloads {
			if len(p) > max && strings.Contains(string(p), "\n") {
				t.Fatalf("payload of %d bytes holds several rejections, bound %d", len(p), max)
			}
			rs2, err := DecodeRejections(p)
			if err != nil {
				t.Fatalf("decode %q: %v", p, err)
			}
			got = append(got, rs2...)
		}
		if len(got) != n {
			t.Fatalf("%d rejections back, want %d", len(got), n)
		}
		for i, r := range got {
			if r.ID != int64(i+1) || r.Token != int64(i) || r.CurrentToken != 1<<60 || !r.At.Equal(at) {
				t.Fatalf("rejection %d came back as %+v", i, r)
			}
		}
	})
}

func abs(n int) int {
	if n < 0 {
		if n == -n { // the most negative int
			return 0
		}
		return -n
	}
	return n
}
