package gateway

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// rawAnswer sends raw on a fresh connection and reads one answer.
func (tg *testGateway) rawAnswer(t *testing.T, raw string) (*http.Response, problem, string) {
	t.Helper()
	c := tg.dial(t)
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	var p problem
	_ = json.Unmarshal(b, &p)
	return resp, p, string(b)
}

func post(target, headers, body string) string {
	return "POST " + target + " HTTP/1.1\r\n" + headers + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// A page in a browser must not take leases from a
// gateway on loopback: not by a simple cross-site POST (no Content-Type,
// text/plain), not through DNS rebinding (a Host the gateway does not own),
// not with a cross-origin request that carries an Origin.
func TestBrowsersCannotReachTheGateway(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{AllowedHosts: DefaultAllowedHosts("127.0.0.1:8080")}, false)
	lease := tg.lease(t, "r")
	acquire := `{"resource":"r2","holder":"h","ttl_ms":60000}`
	for _, tc := range []struct {
		name, raw    string
		status       int
		code, field  string
		wantForwards bool
	}{
		{"rebinding", post("/v1/leases", "Host: rebind.evil.example\r\nOrigin: http://rebind.evil.example\r\nContent-Type: application/json\r\n", acquire), 403, problems.CodeForbidden, "Host", false},
		{"rebinding a write", post("/v1/proxy/svc/x", "Host: rebind.evil.example:8080\r\nFencing-Lease: "+lease+"\r\n", "x"), 403, problems.CodeForbidden, "Host", false},
		{"rebinding a read", "GET /v1/rejections HTTP/1.1\r\nHost: rebind.evil.example\r\n\r\n", 403, problems.CodeForbidden, "Host", false},
		{"the issue's probe", post("/v1/leases", "Host: rebind.evil.example\r\nOrigin: http://evil.example\r\n", acquire), 403, problems.CodeForbidden, "Host", false},
		{"no content type", post("/v1/leases", "Host: 127.0.0.1:8080\r\n", acquire), 415, problems.CodeUnsupportedMediaType, "Content-Type", false},
		{"no content type, foreign origin", post("/v1/leases", "Host: 127.0.0.1:8080\r\nOrigin: http://evil.example\r\n", acquire), 403, problems.CodeForbidden, "Origin", false},
		{"text/plain", post("/v1/leases", "Host: localhost:8080\r\nContent-Type: text/plain\r\n", acquire), 415, problems.CodeUnsupportedMediaType, "Content-Type", false},
		{"form", post("/v1/leases", "Host: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\n", "a=b"), 415, problems.CodeUnsupportedMediaType, "Content-Type", false},
		{"cross-site fetch", post("/v1/leases", "Host: localhost:8080\r\nContent-Type: application/json\r\nSec-Fetch-Site: cross-site\r\n", acquire), 403, problems.CodeForbidden, "Origin", false},
		{"foreign origin", post("/v1/leases", "Host: localhost:8080\r\nContent-Type: application/json\r\nOrigin: http://evil.example\r\n", acquire), 403, problems.CodeForbidden, "Origin", false},
		{"trailing garbage", post("/v1/leases", "Host: localhost:8080\r\nContent-Type: application/json\r\n", acquire+`{"resource":"x"}`), 400, tokens.CodeInvalidRequest, "body", false},
		{"trailing token", post("/v1/leases", "Host: localhost:8080\r\nContent-Type: application/json\r\n", acquire+` x`), 400, tokens.CodeInvalidRequest, "body", false},
		{"a probe by address", "GET /healthz HTTP/1.1\r\nHost: 10.1.2.3:8080\r\n\r\n", 200, "", "", false},
		{"loopback name", post("/v1/leases", "Host: LOCALHOST.:8080\r\nContent-Type: application/json\r\n", acquire+" \n"), 201, "", "", false},
		{"ipv6 loopback", "GET /v1/rejections HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", 200, "", "", false},
		{"same origin", post("/v1/proxy/svc/ok", "Host: 127.0.0.1:8080\r\nFencing-Lease: "+lease+"\r\nOrigin: http://127.0.0.1:8080\r\n", "x"), 200, "", "", true},
	} {
		resp, p, body := tg.rawAnswer(t, tc.raw)
		if resp.StatusCode != tc.status || p.Code != tc.code || p.Field != tc.field {
			t.Errorf("%s: %d %s; want %d %s naming %q", tc.name, resp.StatusCode, body, tc.status, tc.code, tc.field)
		}
	}
	if got := up.seen(); len(got) != 1 || got[0].Path != "/ok" {
		t.Fatalf("upstream got %+v", got)
	}
	// Only the one good acquire took a lease.
	if res, err := tg.svc.Resource(t.Context(), "r2"); err != nil || res.Token != 1 {
		t.Fatalf("r2: %+v %v", res, err)
	}
}

func TestDefaultAllowedHosts(t *testing.T) {
	for listen, want := range map[string]string{
		"127.0.0.1:8080": "localhost 127.0.0.1 ::1",
		"[::1]:0":        "localhost 127.0.0.1 ::1",
		"localhost:80":   "localhost 127.0.0.1 ::1",
		"127.0.0.2:80":   "localhost 127.0.0.1 ::1 127.0.0.2",
		"0.0.0.0:8080":   "",
		":8080":          "",
		"10.0.0.5:8080":  "",
	} {
		if got := strings.Join(DefaultAllowedHosts(listen), " "); got != want {
			t.Errorf("DefaultAllowedHosts(%q) = %q, want %q", listen, got, want)
		}
	}
	l := newHostList([]string{"GW.example.com", "10.0.0.5:8443", "[fd00::1]"})
	for host, want := range map[string]bool{"gw.example.com": true, "gw.example.com.:443": true, "10.0.0.5": true, "[fd00::1]:80": true,
		"evil.example": false, "gw.example.com.evil": false, "": false, "10.0.0.6": false} {
		if l.allows(host) != want {
			t.Errorf("allows(%q) = %v", host, !want)
		}
	}
	if !newHostList([]string{"*"}).allows("anything") || !newHostList(nil).allows("x") {
		t.Error("'*' and an empty list allow any Host")
	}
}

// keyring is an Authenticator over fixed keys that, like auth.Keys, takes
// a key as a bearer token or as the password of HTTP Basic.
type keyring map[string]*Principal

func (k keyring) Authenticate(r *http.Request) (*Principal, error) {
	h := r.Header.Get("Authorization")
	scheme, rest, _ := strings.Cut(h, " ")
	key := rest
	if strings.EqualFold(scheme, "basic") {
		raw, _ := base64.StdEncoding.DecodeString(rest)
		_, key, _ = strings.Cut(string(raw), ":")
	}
	if p, ok := k[key]; ok {
		c := *p
		return &c, nil
	}
	return nil, ErrUnauthenticated
}

func (k keyring) Allow(*Principal) (bool, time.Duration) { return true, 0 }

// HTTP Basic, which a browser caches and sends by itself, is accepted only
// for the dashboard's reads; the API takes bearer keys, and only the
// dashboard offers a Basic prompt.
func TestBasicOnlyForTheDashboard(t *testing.T) {
	up := newRecorder(t)
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "dashboard") })
	tg := startFraming(t, up.URL, Config{UI: ui, Auth: keyring{"k-admin": {Name: "admin", Role: RoleAdmin}}}, false)
	basic := "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("any:k-admin")) + "\r\n"
	bearer := "Authorization: Bearer k-admin\r\n"
	acquire := `{"resource":"r","holder":"h","ttl_ms":60000}`
	for _, tc := range []struct {
		name, raw string
		status    int
		offers    string // the WWW-Authenticate schemes offered on 401
	}{
		{"dashboard", "GET /ui/ HTTP/1.1\r\nHost: gw\r\n" + basic + "\r\n", 200, ""},
		{"dashboard prompt", "GET /ui/ HTTP/1.1\r\nHost: gw\r\n\r\n", 401, "Bearer Basic"},
		{"live feed", "GET /v1/rejections/stream?after=x HTTP/1.1\r\nHost: gw\r\n" + basic + "\r\n", 400, ""},
		{"acquire with basic", post("/v1/leases", "Host: gw\r\nContent-Type: application/json\r\n"+basic, acquire), 401, "Bearer"},
		{"read with basic", "GET /v1/rejections HTTP/1.1\r\nHost: gw\r\n" + basic + "\r\n", 401, "Bearer"},
		{"api prompt", "GET /v1/rejections HTTP/1.1\r\nHost: gw\r\n\r\n", 401, "Bearer"},
		{"acquire with bearer", post("/v1/leases", "Host: gw\r\nContent-Type: application/json\r\n"+bearer, acquire), 201, ""},
	} {
		resp, p, body := tg.rawAnswer(t, tc.raw)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s; want %d", tc.name, resp.StatusCode, body, tc.status)
			continue
		}
		if tc.status == 401 {
			var offers []string
			for _, v := range resp.Header.Values("WWW-Authenticate") {
				offers = append(offers, strings.Fields(v)[0])
			}
			if strings.Join(offers, " ") != tc.offers || p.Code != problems.CodeUnauthorized {
				t.Errorf("%s: offers %q, problem %s; want %q", tc.name, offers, body, tc.offers)
			}
		}
	}
}
