package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oapi-codegen/runtime"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fencegw/fencegw/api"
	"github.com/fencegw/fencegw/api/server"
	"github.com/fencegw/fencegw/storage/bolt"
)

// acquireBodies are request bodies of every kind the hand decoder must tell
// apart: the shapes it takes, and the ones it leaves to the generated
// decoder (other member names, case variants, escapes, null, numbers that
// are not plain int64s, duplicates, trailing data, bad UTF-8, syntax
// errors, wrong types, non-objects).
var acquireBodies = []string{
	`{"resource":"R","ttl_ms":1000}`,
	`{"resource":"R","holder":"h","ttl_ms":1000}`,
	`{"resource":"R","holder":"h","ttl_ms":1000,"wait_ms":0}`,
	` {  "ttl_ms" : 1000 ,"resource":"R"	}` + "\r\n",
	`{"resource":"R","holder":"wörker ✓","ttl_ms":1000}`,
	`{"resource":"R","holder":"<&>","ttl_ms":1000}`,
	`{"resource":"R","holder":"","ttl_ms":-0}`,
	`{"resource":"R","ttl_ms":-5}`,
	`{"resource":"R","ttl_ms":0}`,
	`{"resource":"R","ttl_ms":9223372036854775807}`,
	`{"resource":"R","ttl_ms":-9223372036854775808}`,
	`{"resource":"R","ttl_ms":9223372036854775808}`,
	`{"resource":"R","ttl_ms":99999999999999999999}`,
	`{"resource":"R","ttl_ms":1e3}`,
	`{"resource":"R","ttl_ms":1000.0}`,
	`{"resource":"R","ttl_ms":01000}`,
	`{"resource":"R","ttl_ms":"1000"}`,
	`{"resource":"R","ttl_ms":null}`,
	`{"resource":"R","ttl_ms":true}`,
	`{"resource":"R","ttl_ms":1000,"wait_ms":"x"}`,
	`{"resource":"R","ttl_ms":1000,"wait_ms":1.5}`,
	`{"resource":"R","ttl_ms":1000,"wait_ms":null}`,
	`{"resource":"R","ttl_ms":1000,"holder":null}`,
	`{"resource":"R","ttl_ms":1000,"holder":7}`,
	`{"resource":"R","ttl_ms":1000,"holder":"a\"b"}`,
	`{"resource":"R","ttl_ms":1000,"holder":"a\u0041"}`,
	"{\"resource\":\"R\",\"ttl_ms\":1000,\"holder\":\"a\xffb\"}",
	"{\"resource\":\"R\",\"ttl_ms\":1000,\"holder\":\"a\tb\"}",
	`{"Resource":"R","ttl_ms":1000}`,
	`{"RESOURCE":"R","TTL_MS":1000}`,
	`{"resource":"R","ttl_ms":1000,"extra":[1,{"a":2}]}`,
	`{"resource":"R","ttl_ms":1000,"":1}`,
	`{"resource":"x","resource":"R","ttl_ms":1000}`,
	`{"resource":"R","ttl_ms":5,"ttl_ms":1000}`,
	`{"resource":["R"],"ttl_ms":1000}`,
	`{"resource":{"a":1},"ttl_ms":1000}`,
	`{"resource":"R","ttl_ms":1000}x`,
	`{"resource":"R","ttl_ms":1000}{}`,
	`{"resource":"R","ttl_ms":1000,}`,
	`{"resource":"R" "ttl_ms":1000}`,
	`{"resource":"R","ttl_ms":1000`,
	`{"resource":"R","ttl_ms":-}`,
	`{"resource":"bad name!","ttl_ms":1000}`,
	`{"ttl_ms":1000}`,
	`{"resource":"R"}`,
	`{}`, ` { } `, `[]`, `null`, `"x"`, `7`, ``, ` `, `{`, `}`, `nul`,
}

// The hand decoder never disagrees with the generated one: whatever it
// accepts, encoding/json's Decoder (what the generated strict handler runs)
// accepts too and decodes to the same request.
func FuzzDecodeAcquire(f *testing.F) {
	for _, s := range acquireBodies {
		f.Add([]byte(strings.ReplaceAll(s, "R", "inventory/SKU-1")))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecodeAcquire(t, data)
	})
}

func checkDecodeAcquire(t *testing.T, data []byte) (accepted bool) {
	t.Helper()
	got, ok := decodeAcquire(data)
	if !ok {
		return false
	}
	var want api.AcquireLeaseJSONRequestBody
	if err := runtime.JSONUnmarshalRead(bytes.NewReader(data), &want); err != nil {
		t.Fatalf("%q: the hand decoder accepts what the generated one refuses (%v)", data, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: hand %s, generated %s", data, show(got), show(want))
	}
	return true
}

func show(b api.AcquireLeaseJSONRequestBody) string {
	out, _ := json.Marshal(b)
	return string(out)
}

// The hand decoder takes the bodies clients send, and leaves every shape
// whose outcome it cannot tell exactly to the generated decoder.
func TestDecodeAcquireTakesOnlyPlainShapes(t *testing.T) {
	take := map[string]bool{
		`{"resource":"R","ttl_ms":1000}`: true, `{"resource":"R","holder":"h","ttl_ms":1000}`: true,
		`{"resource":"R","holder":"h","ttl_ms":1000,"wait_ms":0}`: true, ` {  "ttl_ms" : 1000 ,"resource":"R"	}` + "\r\n": true,
		`{"resource":"R","holder":"wörker ✓","ttl_ms":1000}`: true, `{"resource":"R","holder":"<&>","ttl_ms":1000}`: true,
		`{"resource":"R","holder":"","ttl_ms":-0}`: true, `{"resource":"R","ttl_ms":-5}`: true, `{"resource":"R","ttl_ms":0}`: true,
		`{"resource":"R","ttl_ms":9223372036854775807}`: true, `{"resource":"R","ttl_ms":-9223372036854775808}`: true,
		`{"resource":"bad name!","ttl_ms":1000}`: true, `{"ttl_ms":1000}`: true, `{"resource":"R"}`: true, `{}`: true, ` { } `: true,
	}
	for _, s := range acquireBodies {
		if got := checkDecodeAcquire(t, []byte(s)); got != take[s] {
			t.Errorf("%q: taken %v, want %v", s, got, take[s])
		}
	}
}

// The 201 answer is written byte for byte as the generated encoder writes
// it, or left to the generated encoder.
func FuzzAppendLease(f *testing.F) {
	f.Add("worker-3", "fl_abc", "inventory/SKU-1", int64(7), int64(1500), int64(1764590000123456789), false)
	f.Add("<&>\u2028\"", "fl_x", "r", int64(-1), int64(0), int64(0), true)
	f.Add("w\xff", "", "", int64(1), int64(1), int64(-62135596800000000), false)
	f.Fuzz(func(t *testing.T, holder, id, resource string, token, ttl, nanos int64, released bool) {
		at := time.Unix(0, nanos).UTC()
		l := api.Lease{Holder: holder, LeaseId: id, Resource: resource, Token: token, TtlMs: ttl,
			GrantedAt: at, ExpiresAt: at.Add(time.Duration(ttl) * time.Millisecond), State: api.LeaseState("current")}
		if released {
			l.ReleasedAt = &at
		}
		var want bytes.Buffer
		wantErr := json.NewEncoder(&want).Encode(l)
		got, ok := appendLease(nil, l)
		if !ok {
			if plainJSON(holder) && plainJSON(id) && plainJSON(resource) && wantErr == nil {
				t.Fatalf("%+v: left to the generated encoder, which encodes it", l)
			}
			return
		}
		if wantErr != nil || string(got) != want.String() {
			t.Fatalf("hand %q, generated %q (%v)", got, want.String(), wantErr)
		}
	})
}

func TestAppendLeaseMatchesEncoder(t *testing.T) {
	at := time.Date(2026, 12, 1, 20, 0, 0, 123400000, time.UTC)
	for _, l := range []api.Lease{
		{Holder: "worker-3", LeaseId: "fl_abc", Resource: "inventory/SKU-1", Token: 42, TtlMs: 30000, GrantedAt: at, ExpiresAt: at.Add(30 * time.Second), State: "current"},
		{GrantedAt: at, ExpiresAt: at, ReleasedAt: &at, State: "released"},
	} {
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(l); err != nil {
			t.Fatal(err)
		}
		got, ok := appendLease(nil, l)
		if !ok || string(got) != want.String() {
			t.Fatalf("hand %q (%v), generated %q", got, ok, want.String())
		}
	}
}

// Through HTTP, POST /v1/leases answers every body, header and content type
// exactly as the generated handler does: the same status, Content-Type and
// problem document, and for a grant the same lease but for its id and times.
func TestAcquireAgreesWithGenerated(t *testing.T) {
	tg := startFraming(t, newRecorder(t).URL, Config{MaxControlBody: 4096}, false)
	ref := tg.g.routes(tg.g.controlServer(true))
	masks := regexp.MustCompile(`"(lease_id|granted_at|expires_at)":"[^"]*"`)
	type variant struct {
		name  string
		edit  func(*http.Request)
		bodyf func(string) string
	}
	variants := []variant{
		{name: "plain"},
		{name: "client time", edit: func(r *http.Request) { r.Header.Set("Fencing-Client-Time", time.Now().UTC().Format(time.RFC3339Nano)) }},
		{name: "bad client time", edit: func(r *http.Request) { r.Header.Set("Fencing-Client-Time", "yesterday") }},
		{name: "two client times", edit: func(r *http.Request) { r.Header["Fencing-Client-Time"] = []string{"a", "b"} }},
		{name: "text/plain", edit: func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }},
		{name: "no content type", edit: func(r *http.Request) { r.Header.Del("Content-Type") }},
		{name: "+json", edit: func(r *http.Request) { r.Header.Set("Content-Type", "application/vnd.x+json; charset=utf-8") }},
		{name: "no length", edit: func(r *http.Request) { r.ContentLength = -1 }},
		{name: "too large", bodyf: func(s string) string { return s + strings.Repeat(" ", 5000) }},
		{name: "escaped path", edit: func(r *http.Request) { r.URL.RawPath = "/v1/le%61ses" }},
	}
	n := 0
	for _, v := range variants {
		for _, s := range acquireBodies {
			n++
			// Names of one length: problems cite byte offsets.
			mine, theirs := "hand-"+strconv.Itoa(n), "gens-"+strconv.Itoa(n)
			send := func(h http.Handler, resource string) *httptest.ResponseRecorder {
				body := strings.ReplaceAll(s, `"R"`, `"`+resource+`"`)
				if v.bodyf != nil {
					body = v.bodyf(body)
				}
				r := httptest.NewRequest("POST", "http://gw/v1/leases", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				if v.edit != nil {
					v.edit(r)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				return rec
			}
			a, b := send(tg.g, mine), send(ref, theirs)
			ab := masks.ReplaceAllString(a.Body.String(), `"$1":"…"`)
			bb := strings.ReplaceAll(masks.ReplaceAllString(b.Body.String(), `"$1":"…"`), theirs, mine)
			if a.Code != b.Code || ab != bb || a.Header().Get("Content-Type") != b.Header().Get("Content-Type") {
				t.Errorf("%s %q:\n hand      %d %s %s\n generated %d %s %s", v.name, s,
					a.Code, a.Header().Get("Content-Type"), ab, b.Code, b.Header().Get("Content-Type"), bb)
			}
		}
	}
}

// generatedCalled fails the test when the generated AcquireLease runs.
type generatedCalled struct {
	server.ServerInterface
	t *testing.T
}

func (g generatedCalled) AcquireLease(w http.ResponseWriter, r *http.Request, p api.AcquireLeaseParams) {
	g.t.Errorf("a plain body went to the generated decoder")
	g.ServerInterface.AcquireLease(w, r, p)
}

// The gateway's POST /v1/leases serves a plain body by hand: its chain
// hands fastAcquire the bytes controlBody read.
func TestAcquireTakesTheHandPath(t *testing.T) {
	tg := startFraming(t, newRecorder(t).URL, Config{}, false)
	fast := tg.g.controlServer(false).(*fastAcquire)
	fast.ServerInterface = generatedCalled{ServerInterface: fast.ServerInterface, t: t}
	h := tg.g.dispatch(http.NotFoundHandler(), tg.g.acquireHandler(fast))
	for i, body := range []string{`{"resource":"r1","ttl_ms":1000}`, `{"resource":"r2","holder":"w","ttl_ms":1000,"wait_ms":0}`} {
		r := httptest.NewRequest("POST", "http://gw/v1/leases", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), `"resource":"r`+strconv.Itoa(i+1)+`"`) {
			t.Fatalf("%s: %d %s", body, rec.Code, rec.Body)
		}
	}
}

// The decoding and encoding steps alone, hand against generated.
func BenchmarkAcquireCodec(b *testing.B) {
	body := []byte(`{"resource":"inventory/SKU-001","holder":"worker-3","ttl_ms":30000}`)
	at := time.Now().UTC()
	lease := api.Lease{Holder: "worker-3", LeaseId: "fl_0123456789abcdef0123", Resource: "inventory/SKU-001", Token: 42,
		TtlMs: 30000, GrantedAt: at, ExpiresAt: at.Add(30 * time.Second), State: "current"}
	b.Run("decode/hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := decodeAcquire(body); !ok {
				b.Fatal("declined")
			}
		}
	})
	b.Run("decode/generated", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var v api.AcquireLeaseJSONRequestBody
			if err := runtime.JSONUnmarshalRead(bytes.NewReader(body), &v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode/hand", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 512)
		for b.Loop() {
			if _, ok := appendLease(buf[:0], lease); !ok {
				b.Fatal("declined")
			}
		}
	})
	b.Run("encode/generated", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var buf bytes.Buffer
			if err := json.NewEncoder(&buf).Encode(lease); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A grant through the gateway's handler (fresh resources, the embedded
// store: each one a committed, fsynced transaction, so ns/op is the disk's;
// allocs/op is the point), by hand and through the generated code alone.
func BenchmarkAcquireHTTP(b *testing.B) {
	tg := startFraming(b, "http://127.0.0.1:1", Config{}, false)
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{{"hand", tg.g}, {"generated", tg.g.routes(tg.g.controlServer(true))}} {
		n := 0 // across the runs of the sub-benchmark: every resource fresh
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				n++
				r := httptest.NewRequest("POST", "http://gw/v1/leases",
					strings.NewReader(`{"resource":"bench/`+bc.name+`/`+strconv.Itoa(n)+`","holder":"worker-3","ttl_ms":30000}`))
				r.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				bc.h.ServeHTTP(rec, r)
				if rec.Code != http.StatusCreated {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
			}
		})
	}
}

// Grants as a user drives them: clients on connections of their own (64
// with GOMAXPROCS 2, as fencegw-load -grants) POST fresh resources to the
// gateway on a real listener. The clients are raw and lean (a request
// written from a template, the answer read with http.ReadResponse), so
// allocs/op is mostly the server's; ns/op is bound by the store's fsyncs.
// grants/commit is how many grants shared each commit and its fsyncs.
func BenchmarkAcquireListener(b *testing.B) {
	var store *bolt.Store
	tg := startFramingWith(b, "http://127.0.0.1:1", Config{}, false, func(s *bolt.Store, _ *Config, _ *http.Server) { store = s })
	commits := func() uint64 {
		var m dto.Metric
		if err := store.Collectors()[0].(prometheus.Metric).Write(&m); err != nil {
			b.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}
	var seq atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		conn, err := net.Dial("tcp", tg.addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		var req []byte
		for pb.Next() {
			body := `{"resource":"bench/listener/` + strconv.FormatInt(seq.Add(1), 10) + `","holder":"worker-3","ttl_ms":30000}`
			req = append(req[:0], "POST /v1/leases HTTP/1.1\r\nHost: "+tg.addr+"\r\nContent-Type: application/json\r\nContent-Length: "...)
			req = strconv.AppendInt(req, int64(len(body)), 10)
			req = append(append(req, "\r\n\r\n"...), body...)
			if _, err := conn.Write(req); err != nil {
				b.Error(err)
				return
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	if n := commits(); n > 0 {
		b.ReportMetric(float64(seq.Load())/float64(n), "grants/commit")
	}
}
