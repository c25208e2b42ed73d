package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// Every control body is taken strictly: a member the call has no field
// for, or one given twice, is 400 invalid_request naming it, through the
// real server (controlBody, fastAcquire and the generated strict handler).
func TestControlBodiesAreStrict(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, false)
	base := "http://" + tg.addr
	post := func(path, body string) (int, problem) {
		t.Helper()
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var p problem
		_ = json.Unmarshal(data, &p)
		return resp.StatusCode, p
	}
	status, _ := post("/v1/leases", `{"resource":"r0","holder":"w1","ttl_ms":60000}`)
	if status != http.StatusCreated {
		t.Fatalf("a good acquire: %d", status)
	}
	for _, c := range []struct{ path, body, field, detail string }{
		{"/v1/leases", `{"resource":"r9","holder":"w2","ttl_ms":5000,"waitms":3000}`, "waitms", "not a field of this call (its fields: holder, resource, ttl_ms, wait_ms)"},
		{"/v1/leases", `{"resource":"r9","ttl_ms":5000,"ttl":5}`, "ttl", "not a field"},
		{"/v1/leases", `{"resource":"r9","resource":"r8","ttl_ms":5000}`, "resource", "given twice"},
		{"/v1/leases", `{"Resource":"r9","ttl_ms":5000}`, "Resource", "not a field"},
		{"/v1/leases", `{"resource":"r9","\u0072esource":"r8","ttl_ms":5000}`, "resource", "given twice"},
		{"/v1/leases", `{"resource":"r9","ttl_ms":5000,"wait_ms":0,"wait_ms":9000}`, "wait_ms", "given twice"},
		{"/v1/leases", `{"resource":"r9","ttl_ms":5000,"extra":{"nested":[1,{"a":"}"}]}}`, "extra", "not a field"},
		{"/v1/leases", `{"resource":"r9","ttl_ms":5000,"bad\nname":1}`, `"bad\nname"`, "not a field"},
		{"/v1/leases/nope/renew", `{"ttl_ms":5000,"ttlms":1}`, "ttlms", "its fields: ttl_ms"},
		{"/v1/leases/nope/renew", `{"ttl_ms":5000,"ttl_ms":1}`, "ttl_ms", "given twice"},
		{"/v1/leases/nope/revoke", `{"force":true}`, "force", "it takes no body"},
		// The spec's required members, absent or null: named as such, not
		// judged as the zero encoding/json would make of them.
		{"/v1/leases", `{"resource":"r9","holder":"w2"}`, "ttl_ms", "is required"},
		{"/v1/leases", `{"resource":"r9","ttl_ms":null}`, "ttl_ms", "is required"},
		{"/v1/leases", `{"holder":"w2","ttl_ms":5000}`, "resource", "is required"},
		{"/v1/leases", `{}`, "resource", "is required"},
		{"/v1/leases", `{"resource":null,"ttl_ms":null}`, "resource", "is required"},
	} {
		status, p := post(c.path, c.body)
		if status != http.StatusBadRequest || p.Code != "invalid_request" || p.Field != c.field || !strings.Contains(p.Detail, c.detail) {
			t.Errorf("POST %s %s: %d %+v, want 400 invalid_request, field %s, detail with %q", c.path, c.body, status, p, c.field, c.detail)
		}
	}
	// Bodies without extra members pass on to the call (404: no such lease);
	// renew's ttl_ms is optional, absent or null.
	for _, c := range [][2]string{
		{"/v1/leases/nope/renew", `{"ttl_ms":5000}`}, {"/v1/leases/nope/renew", `{}`},
		{"/v1/leases/nope/renew", `{"ttl_ms":null}`}, {"/v1/leases/nope/revoke", `{}`},
	} {
		if status, p := post(c[0], c[1]); status != http.StatusNotFound {
			t.Errorf("POST %s %s: %d %+v, want 404", c[0], c[1], status, p)
		}
	}
}

// checkFields of a body that has its fields once allocates nothing: it
// runs on every grant.
func TestCheckFieldsAllocatesNothing(t *testing.T) {
	body := []byte(`{"resource":"accounts/42","holder":"worker-7","ttl_ms":30000,"wait_ms":100}`)
	if n := testing.AllocsPerRun(100, func() { _ = checkFields(body, acquireFields) }); n != 0 {
		t.Errorf("%v allocations per body, want 0", n)
	}
}

// The fields are the generated request types': the spec's.
func TestBodyFieldsAreTheSpecs(t *testing.T) {
	if got := acquireFields.list; got != "holder, resource, ttl_ms, wait_ms" {
		t.Errorf("acquire fields %q", got)
	}
	if got := renewFields.list; got != "ttl_ms" {
		t.Errorf("renew fields %q", got)
	}
	if got := namesOf(acquireFields, acquireFields.required); !slices.Equal(got, acquireRequired) {
		t.Errorf("acquire's required fields %q, want the spec's %q", got, acquireRequired)
	}
	if renewFields.required != 0 || noFields.required != 0 {
		t.Errorf("renew's required fields %q, want none", namesOf(renewFields, renewFields.required))
	}
}

// acquireRequired is the spec's required list of AcquireRequest.
var acquireRequired = []string{"resource", "ttl_ms"}

func namesOf(f bodyFields, mask uint8) []string {
	var names []string
	for i, n := range f.names {
		if mask&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	return names
}

// FuzzCheckFields holds checkFields to encoding/json's own reading of the
// body's member names: for a valid JSON object it refuses exactly those
// with a member not among the fields (compared exactly, after unescaping),
// one given twice, or a required one absent or null, and it never panics
// on anything.
func FuzzCheckFields(f *testing.F) {
	for _, s := range []string{
		`{"resource":"r","ttl_ms":1}`, `{"resource":"r","resource":"s"}`, `{"waitms":1}`,
		`{"a":{"b":[1,"}",{"c":null}]},"ttl_ms":2}`, `{"\u0072esource":"x"}`, `[]`, `{`, `"x"`, `{"a\"b":1}`,
		` { "holder" : "h" , "wait_ms" : -1e5 } `, `{"resource":null,"ttl_ms":1}`, `{"resource":"r","ttl_ms":nul}`,
		`{"resource":"r","ttl_ms" : null }`, `{"ttl_ms":1,"resource":"nullable"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := checkFields(data, acquireFields) // must not panic, whatever data is
		if !json.Valid(data) {
			return
		}
		want := referenceFieldsError(data, acquireFields.names, acquireRequired)
		if (err != nil) != want {
			t.Fatalf("checkFields(%q) = %v, want an error: %v", data, err, want)
		}
	})
}

// referenceFieldsError reads the top-level member names with
// encoding/json's tokenizer.
func referenceFieldsError(data []byte, names, required []string) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return false
	}
	seen, given := map[string]bool{}, map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		name := tok.(string)
		known := false
		for _, n := range names {
			known = known || n == name
		}
		if !known || seen[name] {
			return true
		}
		seen[name] = true
		var value json.RawMessage
		if dec.Decode(&value) != nil {
			return false
		}
		given[name] = string(value) != "null"
	}
	for _, n := range required {
		if !given[n] {
			return true
		}
	}
	return false
}
