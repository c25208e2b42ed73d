package auth

import (
	"net/http/httptest"
	"testing"
)

// FuzzParse: no auth file makes Parse panic, and a file it accepts has
// well-formed keys.
func FuzzParse(f *testing.F) {
	f.Add([]byte(testFile()))
	f.Add([]byte(`{"keys": [{"name": "a", "sha256": "` + Hash("x") + `", "role": "admin"}]}`))
	f.Add([]byte("keys:\n  - {name: a, sha256: " + Hash("x") + ", role: worker, resources: [\"stmt:\"]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		for _, e := range c.Keys.all {
			if e.principal.Name == "" || e.principal.Role < 1 || e.principal.Role > 3 {
				t.Fatalf("accepted a malformed key: %+v", e.principal)
			}
		}
	})
}

// FuzzAuthenticate: any Authorization header is either one configured key
// or ErrUnauthenticated, never a panic.
func FuzzAuthenticate(f *testing.F) {
	keys, err := Parse([]byte(testFile()))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("Bearer " + workerKey)
	f.Add(basic("u", viewerKey))
	f.Add("Basic Og==")
	f.Add("bearer  ")
	f.Fuzz(func(t *testing.T, header string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header["Authorization"] = []string{header}
		p, err := keys.Keys.Authenticate(r)
		if (p == nil) == (err == nil) {
			t.Fatalf("Authenticate(%q) = %v, %v", header, p, err)
		}
		if p != nil && p.Name != "billing" && p.Name != "dash" {
			t.Fatalf("Authenticate(%q) = %+v", header, p)
		}
	})
}
