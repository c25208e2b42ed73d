package wire

import (
	"net/url"
	"testing"
)

// FuzzEscapedPath: EscapedPath is net/url's, for any path and RawPath; and
// a path PlainPath takes is its own escaped form.
func FuzzEscapedPath(f *testing.F) {
	for _, s := range [][2]string{
		{"/v1/proxy/svc/lines", ""},
		{"/a;b,c=d@e:f$g&h+i~j", ""},
		{"/a b", ""},
		{"/a!b", "/a!b"},
		{"/a b", "/a%20b"},
		{"/a/b", "/a%2Fb"},
		{"*", ""},
		{"", ""},
		{"/é", ""},
		{"/a?b", ""},
		{"/a%b", ""},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, path, rawPath string) {
		u := &url.URL{Path: path, RawPath: rawPath}
		if got, want := EscapedPath(u), u.EscapedPath(); got != want {
			t.Fatalf("EscapedPath(%q, %q) = %q, net/url: %q", path, rawPath, got, want)
		}
		if PlainPath(path) {
			if esc := (&url.URL{Path: path}).EscapedPath(); esc != path {
				t.Fatalf("plain path %q escapes to %q", path, esc)
			}
		}
	})
}
