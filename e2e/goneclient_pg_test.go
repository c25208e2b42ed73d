package e2e

// A client gone once its fenced write reached the gateway, in the
// PostgreSQL modes: the write runs on to the upstream's answer, its
// outcome is known and nothing drains in PostgreSQL.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// A fenced write is in flight (the upstream holds its answer) when its
// client half-closes its connection (CloseWrite, as `nc -N` does) or closes
// it; then the upstream answers. The write is not aborted (design.md, "Where
// the road differs": context.WithoutCancel in direct.go): the upstream got
// it once, the half-closed client reads the upstream's answer, and the
// resource does not drain: released, it is granted at once on the other
// replica, and GET /v1/resources/{resource} names no drain. Both roads of a
// fenced write are taken: a Content-Length body (the listener's own loop,
// which gives a request no cancellation) and a chunked one (lent to Go's
// server, which cancels the request's context once the client is gone:
// aborted there, the client would get a 502 or nothing, and the resource
// would drain for 30 s, refusing the grant at once with fence_busy).
func TestGoneClientWriteRunsOnPostgres(t *testing.T) {
	const drain = 30 * time.Second // far beyond the grant's wait: a drain refuses it at once
	for _, m := range sharedStoreModes("fencegw-e2e-gone:") {
		t.Run(m.name, func(t *testing.T) {
			pgtest.Require(t)
			schema := pgtest.NewSchema(t)
			up := newUpstream(t)
			o := options{forwardTimeout: 5 * time.Second, drainPeriod: drain, grantWait: 5 * time.Second}
			var gws []*gw
			for i := range 2 {
				gws = append(gws, startWith(t, pgMode(t, m.config(t, schema), i), map[string]string{"svc": up.URL}, o))
			}
			u, err := url.Parse(gws[0].URL)
			if err != nil {
				t.Fatal(err)
			}
			for _, road := range []struct{ name, head, body string }{
				{"length", "Content-Length: 5\r\n", "write"},
				{"chunked", "Transfer-Encoding: chunked\r\n", "5\r\nwrite\r\n0\r\n\r\n"},
			} {
				for _, halfClose := range []bool{true, false} {
					name := road.name + "/closed"
					if halfClose {
						name = road.name + "/half-closed"
					}
					t.Run(name, func(t *testing.T) {
						res := fmt.Sprintf("gone-%s-%s-%v", m.name, road.name, halfClose)
						arrived, answer := make(chan struct{}), make(chan struct{})
						up.setHold(func(a arrival) {
							if a.Resource != res {
								return
							}
							close(arrived)
							<-answer
						})
						t.Cleanup(func() { up.setHold(nil) })
						let := sync.OnceFunc(func() { close(answer) }) // the upstream answers
						defer let()
						l := acquire(t, gws[0].URL, res, "A", 30*time.Second)

						c, err := net.Dial("tcp", u.Host)
						if err != nil {
							t.Fatal(err)
						}
						defer c.Close()
						_ = c.SetDeadline(time.Now().Add(10 * time.Second))
						if _, err := io.WriteString(c, "POST /v1/proxy/svc/gone HTTP/1.1\r\nHost: gw.example\r\n"+
							gateway.HeaderLease+": "+l.LeaseID+"\r\n"+road.head+"\r\n"+road.body); err != nil {
							t.Fatal(err)
						}
						select {
						case <-arrived:
						case <-time.After(5 * time.Second):
							t.Fatal("the write did not reach the upstream")
						}
						if halfClose {
							err = c.(*net.TCPConn).CloseWrite()
						} else {
							err = c.Close()
						}
						if err != nil {
							t.Fatal(err)
						}
						// Past the gateway's sight of the client gone (Go's
						// server hears the FIN at once), then the answer.
						time.Sleep(200 * time.Millisecond)
						let()

						if halfClose {
							resp, err := http.ReadResponse(bufio.NewReader(c), nil)
							if err != nil {
								t.Fatalf("no answer after the client half-closed: %v", err)
							}
							b, _ := io.ReadAll(resp.Body)
							_ = resp.Body.Close()
							if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/plain" || string(b) == "" || b[0] != 'o' {
								t.Errorf("answer %d %q; want the upstream's 200 \"ok <seq>\"", resp.StatusCode, b)
							}
						}

						// Released, the resource is granted at once on the
						// other replica (after the write, which the grant
						// waits for, is done): no drain.
						if r := do(t, "DELETE", gws[0].URL+"/v1/leases/"+l.LeaseID, nil); r.Status != http.StatusNoContent {
							t.Fatalf("release: %d %s", r.Status, r.Body)
						}
						asked := time.Now()
						b := do(t, "POST", gws[1].URL+"/v1/leases", map[string]any{"resource": res, "holder": "B", "ttl_ms": 10000, "wait_ms": 5000})
						if b.Status != http.StatusCreated {
							t.Fatalf("grant after a write carried to its answer: %d %s; want 201 (no drain)", b.Status, b.Body)
						}
						if took := time.Since(asked); took > 2*time.Second {
							t.Errorf("the grant took %v; want it at once", took)
						}
						var bl leaseJSON
						if err := json.Unmarshal(b.Body, &bl); err != nil {
							t.Fatal(err)
						}
						if bl.Token != l.Token+1 {
							t.Errorf("token %d after %d", bl.Token, l.Token)
						}
						st := do(t, "GET", gws[0].URL+"/v1/resources/"+url.PathEscape(res), nil)
						var state struct {
							Token      int64      `json:"token"`
							DrainUntil *time.Time `json:"drain_until"`
						}
						if st.Status != http.StatusOK {
							t.Fatalf("resource: %d %s", st.Status, st.Body)
						}
						if err := json.Unmarshal(st.Body, &state); err != nil {
							t.Fatal(err)
						}
						if state.DrainUntil != nil || state.Token != bl.Token {
							t.Fatalf("resource %s; want token %d and no drain_until", st.Body, bl.Token)
						}

						n := 0
						for _, a := range up.seen() {
							if a.Resource == res {
								n++
								if a.Body != "write" || a.Token != l.Token {
									t.Errorf("the upstream got %q with token %d; want %q with %d", a.Body, a.Token, "write", l.Token)
								}
							}
						}
						if n != 1 {
							t.Fatalf("the upstream got %d requests for %s; want 1", n, res)
						}
					})
				}
			}
		})
	}
}
