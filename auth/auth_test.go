package auth

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const (
	workerKey = "fgk_worker-key-for-tests"
	viewerKey = "fgk_viewer-key-for-tests"
)

func testFile() string {
	return `
keys:
  - name: billing
    sha256: ` + Hash(workerKey) + `
    role: worker
    resources: ["stmt:", "inventory/"]
    rate: 2
    burst: 3
    max_ttl_ms: 60000
    max_leases: 5
  - name: dash
    sha256: ` + Hash(viewerKey) + `
    role: viewer
upstreams:
  - upstream: statements
    headers:
      Authorization: Bearer upstream-secret
      x-api-key: k
`
}

func mustParse(t *testing.T, data string) *Config {
	t.Helper()
	c, err := Parse([]byte(data))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func TestParseYAML(t *testing.T) {
	c := mustParse(t, testFile())
	if c.Keys.Len() != 2 {
		t.Fatalf("Len = %d, want 2", c.Keys.Len())
	}
	h := c.UpstreamHeaders["statements"]
	if h.Get("Authorization") != "Bearer upstream-secret" || h.Get("X-Api-Key") != "k" {
		t.Fatalf("upstream headers = %v", h)
	}
	p := c.Keys.byName["billing"].principal
	if p.Role != RoleWorker || p.MaxTTL != time.Minute || p.MaxLeases != 5 || len(p.Resources) != 2 ||
		p.Rate != 2 || p.Burst != 3 {
		t.Fatalf("principal = %+v", p)
	}
}

func TestParseJSON(t *testing.T) {
	c := mustParse(t, "{\n\t\"keys\": [{\"name\": \"a\", \"sha256\": \""+Hash("x")+"\", \"role\": \"admin\"}]\n}")
	if p := c.Keys.byName["a"].principal; p.Role != RoleAdmin {
		t.Fatalf("principal = %+v", p)
	}
}

func TestParseRefuses(t *testing.T) {
	h := Hash("x")
	key := func(extra string) string {
		return "keys:\n  - {name: a, sha256: " + h + ", role: worker" + extra + "}\n"
	}
	for name, data := range map[string]string{
		"empty":            "",
		"no keys":          "keys: []\n",
		"unknown field":    key(", resource: [x]"),
		"bad hash":         "keys:\n  - {name: a, sha256: abc, role: worker}\n",
		"plain key":        "keys:\n  - {name: a, sha256: " + strings.Repeat("z", 64) + ", role: worker}\n",
		"bad role":         "keys:\n  - {name: a, sha256: " + h + ", role: root}\n",
		"no name":          "keys:\n  - {sha256: " + h + ", role: worker}\n",
		"duplicate name":   key("") + "  - {name: a, sha256: " + Hash("y") + ", role: worker}\n",
		"duplicate key":    key("") + "  - {name: b, sha256: " + h + ", role: worker}\n",
		"bad prefix":       key(", resources: [\"a b\"]"),
		"negative rate":    key(", rate: -1"),
		"huge max_leases":  key(", max_leases: 100000"),
		"huge max_ttl":     key(", max_ttl_ms: 99999999999"),
		"header fencing":   key("") + "upstreams:\n  - {upstream: s, headers: {Fencing-Token: \"9\"}}\n",
		"header host":      key("") + "upstreams:\n  - {upstream: s, headers: {Host: evil}}\n",
		"header bad name":  key("") + "upstreams:\n  - {upstream: s, headers: {\"a b\": x}}\n",
		"header CRLF":      key("") + "upstreams:\n  - {upstream: s, headers: {X-A: \"a\\r\\nX-B: b\"}}\n",
		"upstream twice":   key("") + "upstreams:\n  - {upstream: s}\n  - {upstream: s}\n",
		"json unknown key": `{"keys": [{"name": "a", "sha256": "` + h + `", "role": "worker", "admin": true}]}`,
	} {
		if _, err := Parse([]byte(data)); err == nil {
			t.Errorf("%s: Parse accepted %q", name, data)
		}
	}
}

func request(header ...string) *http.Request {
	r := httptest.NewRequest("GET", "/v1/rejections", nil)
	for _, h := range header {
		r.Header.Add("Authorization", h)
	}
	return r
}

func basic(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

func TestAuthenticate(t *testing.T) {
	keys := mustParse(t, testFile()).Keys
	for _, tc := range []struct {
		name string
		r    *http.Request
		want string // principal name; "" for ErrUnauthenticated
	}{
		{"bearer", request("Bearer " + workerKey), "billing"},
		{"bearer any case", request("bearer " + viewerKey), "dash"},
		{"basic password", request(basic("anyone", viewerKey)), "dash"},
		{"none", request(), ""},
		{"wrong key", request("Bearer fgk_nope"), ""},
		{"key as user name", request(basic(workerKey, "")), ""},
		{"the hash itself", request("Bearer " + Hash(workerKey)), ""},
		{"prefix of a key", request("Bearer " + workerKey[:len(workerKey)-1]), ""},
		{"two headers", request("Bearer "+workerKey, "Bearer "+viewerKey), ""},
		{"other scheme", request("Token " + workerKey), ""},
		{"bad base64", request("Basic !!!"), ""},
		{"empty bearer", request("Bearer "), ""},
		{"huge", request("Bearer " + strings.Repeat("a", 5000)), ""},
	} {
		p, err := keys.Authenticate(tc.r)
		switch {
		case tc.want == "" && (err == nil || p != nil):
			t.Errorf("%s: Authenticate = %+v, %v; want ErrUnauthenticated", tc.name, p, err)
		case tc.want != "" && (err != nil || p.Name != tc.want):
			t.Errorf("%s: Authenticate = %+v, %v; want %s", tc.name, p, err, tc.want)
		}
	}
	// Callers get a copy: changing it changes nothing configured.
	p, _ := keys.Authenticate(request("Bearer " + workerKey))
	p.Role = RoleAdmin
	if again, _ := keys.Authenticate(request("Bearer " + workerKey)); again.Role != RoleWorker {
		t.Fatalf("the configured principal changed: %+v", again)
	}
}

func TestMayUse(t *testing.T) {
	keys := mustParse(t, testFile()).Keys
	p := keys.byName["billing"].principal
	for res, want := range map[string]bool{
		"stmt:acct:1": true, "inventory/SKU-1": true, "stmt": false, "inventory": false, "billing/x": false, "xstmt:1": false,
	} {
		if got := p.MayUse(res); got != want {
			t.Errorf("MayUse(%q) = %v, want %v", res, got, want)
		}
	}
	if v := keys.byName["dash"].principal; !v.MayUse("anything") {
		t.Error("a key without prefixes may use every resource")
	}
}

// A principal carries the rate and the burst a shared bucket is taken
// with: an unset burst is the rate rounded up, at least 1.
func TestPrincipalRate(t *testing.T) {
	for _, c := range []struct {
		line  string
		rate  float64
		burst int
	}{{"", 0, 0}, {", rate: 0.5", 0.5, 1}, {", rate: 2.5", 2.5, 3}, {", rate: 2, burst: 9", 2, 9}} {
		keys := mustParse(t, "keys:\n  - {name: k, sha256: "+Hash("secret")+", role: worker"+c.line+"}\n").Keys
		if p := keys.byName["k"].principal; p.Rate != c.rate || p.Burst != c.burst {
			t.Errorf("%q: rate %v, burst %d; want %v, %d", c.line, p.Rate, p.Burst, c.rate, c.burst)
		}
	}
}

func TestRateLimit(t *testing.T) {
	keys := mustParse(t, testFile()).Keys
	now := time.Unix(1000, 0)
	keys.now = func() time.Time { return now }
	p := &Principal{Name: "billing"}
	for i := range 3 { // burst 3
		if ok, _ := keys.Allow(p); !ok {
			t.Fatalf("request %d refused within the burst", i)
		}
	}
	ok, wait := keys.Allow(p)
	if ok || wait <= 0 || wait > 500*time.Millisecond {
		t.Fatalf("4th request: ok %v, wait %v; want refused, about 500ms (rate 2/s)", ok, wait)
	}
	now = now.Add(wait)
	if ok, _ := keys.Allow(p); !ok {
		t.Fatal("refused after waiting Retry-After")
	}
	now = now.Add(time.Hour) // saving up is capped at the burst
	for range 3 {
		keys.Allow(p)
	}
	if ok, _ := keys.Allow(p); ok {
		t.Fatal("more than the burst after a long pause")
	}
	if ok, _ := keys.Allow(&Principal{Name: "dash"}); !ok {
		t.Fatal("a key without a rate was limited")
	}
}

func TestGenerateKey(t *testing.T) {
	a, b := GenerateKey(), GenerateKey()
	if a == b || !strings.HasPrefix(a, KeyPrefix) || len(a) < 40 {
		t.Fatalf("GenerateKey = %q, %q", a, b)
	}
	if len(Hash(a)) != 64 || Hash(a) == Hash(b) {
		t.Fatalf("Hash = %q", Hash(a))
	}
	// A generated key round-trips through a file.
	keys := mustParse(t, "keys:\n  - {name: n, sha256: "+Hash(a)+", role: viewer}\n").Keys
	if p, err := keys.Authenticate(request("Bearer " + a)); err != nil || p.Name != "n" {
		t.Fatalf("Authenticate(generated) = %+v, %v", p, err)
	}
}

// A reload keeps the rate budget of a key whose name, rate and burst are
// unchanged: its burst is not refilled by reloading.
func TestKeepBudgets(t *testing.T) {
	file := func(rate int) []byte {
		return []byte(fmt.Sprintf("keys:\n  - {name: k, sha256: %s, role: worker, rate: %d, burst: 1}\n", Hash("secret"), rate))
	}
	old, err := Parse(file(1))
	if err != nil {
		t.Fatal(err)
	}
	p := &Principal{Name: "k"}
	if ok, _ := old.Keys.Allow(p); !ok {
		t.Fatal("the first request is refused")
	}
	same, _ := Parse(file(1))
	same.Keys.KeepBudgets(old.Keys)
	if ok, _ := same.Keys.Allow(p); ok {
		t.Fatal("the reloaded key's burst was refilled")
	}
	changed, _ := Parse(file(2))
	changed.Keys.KeepBudgets(old.Keys)
	if ok, _ := changed.Keys.Allow(p); !ok {
		t.Fatal("a key whose rate changed does not start with its new budget")
	}
}
