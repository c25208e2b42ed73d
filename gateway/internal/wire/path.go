package wire

import "net/url"

// EscapedPath is u.EscapedPath(), the path of a request target as net/url
// writes it. A path without a RawPath whose every byte net/url leaves as
// it is (PlainPathByte) is that path: EscapedPath reads it through
// shouldEscape a byte at a time to find that out, and a fenced write's
// path is read so three times (the gateway's route, the reverse proxy's
// join with the upstream's, the engine's request line). FuzzEscapedPath
// holds the two to one result.
func EscapedPath(u *url.URL) string {
	if u.RawPath == "" && PlainPath(u.Path) {
		return u.Path
	}
	return u.EscapedPath()
}

// PlainPath reports whether every byte of p is one net/url leaves as it
// is in a path (PlainPathByte), so that p is its own escaped form.
func PlainPath(p string) bool {
	for i := 0; i < len(p); i++ {
		if !plainPathBytes[p[i]] {
			return false
		}
	}
	return true
}

// PlainPathByte reports whether net/url leaves b in a path as it is:
// unreserved (letters, digits, "-._~"), or a reserved character it does
// not escape in a path ("/$&+,:;=@").
func PlainPathByte(b byte) bool { return plainPathBytes[b] }

var plainPathBytes = func() (t [256]bool) {
	for _, b := range []byte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/$&+,:;=@") {
		t[b] = true
	}
	return t
}()
