package gateway

// The differential smuggling test of the lease calls: acquires (POST
// /v1/leases) and releases (DELETE /v1/leases/{id}), which the listener's
// own loop serves, and renewals and revocations (POST
// /v1/leases/{id}/renew, /revoke), which Go's server serves behind the
// framing rules. Each raw input goes, on a connection of its own, to a
// real gateway listener and, as it is, to Go's own HTTP server, which
// records the requests it parsed. A lease the gateway grants, renews or
// ends must be one Go's server parsed whole from the same bytes: a request
// hidden in another's body (CL.TE, TE.CL, a body the gateway refused
// before reading it) never takes effect. No input gets a 5xx, and every
// 4xx is a problem document.

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// leaseInput builds one input from the names of its two resources and the
// id of a lease held on a third.
type leaseInput func(r1, r2, held string) string

// leaseCase is an input and what the gateway must do with it: grant the
// resources grants names (1 for r1, 2 for r2) and nothing else, and
// do to the held lease what held says.
type leaseCase struct {
	name   string
	in     leaseInput
	grants []int
	held   heldEffect
}

// heldEffect is what an input did to the held lease: ended it (released
// or revoked), renewed it, or neither.
type heldEffect struct{ ended, renewed bool }

var (
	untouched = heldEffect{}
	ended     = heldEffect{ended: true}
	renewed   = heldEffect{renewed: true}
)

const acquireHead = "POST /v1/leases HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"

// acquire is a whole acquire of resource, extra fields (each ending in
// CRLF) before its Content-Length.
func acquire(resource, extra string) string {
	b := acquireBody(resource)
	return acquireHead + extra + "Content-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + b
}

// release is a whole release of the lease id, extra fields after Host.
func release(id, extra string) string {
	return "DELETE /v1/leases/" + id + " HTTP/1.1\r\nHost: gw\r\n" + extra + "\r\n"
}

// renew and revoke are a whole renewal and revocation of the lease id,
// extra fields after Host, without a body.
func renew(id, extra string) string {
	return "POST /v1/leases/" + id + "/renew HTTP/1.1\r\nHost: gw\r\n" + extra + "Content-Length: 0\r\n\r\n"
}

func revoke(id, extra string) string {
	return "POST /v1/leases/" + id + "/revoke HTTP/1.1\r\nHost: gw\r\n" + extra + "Content-Length: 0\r\n\r\n"
}

const closeField = "Connection: close\r\n"

var leaseCases = []leaseCase{
	{"acquire", func(r1, _, _ string) string { return acquire(r1, closeField) }, []int{1}, untouched},
	{"acquires-pipelined", func(r1, r2, _ string) string { return acquire(r1, "") + acquire(r2, closeField) }, []int{1, 2}, untouched},
	{"acquire-chunked", func(r1, _, _ string) string {
		return acquireHead + "Transfer-Encoding: chunked\r\n" + closeField + "\r\n" + chunk(acquireBody(r1)) + "0\r\n\r\n"
	}, []int{1}, untouched},
	{"acquire-expect-continue", func(r1, _, _ string) string { return acquire(r1, "Expect: 100-continue\r\n"+closeField) }, []int{1}, untouched},
	{"acquire-http10-keep-alive", func(r1, r2, _ string) string {
		a := strings.Replace(acquire(r1, "Connection: keep-alive\r\n"), "HTTP/1.1", "HTTP/1.0", 1)
		return a + strings.Replace(acquire(r2, ""), "HTTP/1.1", "HTTP/1.0", 1)
	}, []int{1, 2}, untouched},
	{"acquire-absolute-form", func(r1, _, _ string) string {
		return strings.Replace(acquire(r1, closeField), "POST /v1/leases", "POST http://gw/v1/leases", 1)
	}, []int{1}, untouched},
	// CL.TE and TE.CL: an acquire hidden behind an empty chunked body.
	{"cl-te-hidden-acquire", func(_, r2, _ string) string {
		body := "0\r\n\r\n" + acquire(r2, closeField)
		return acquireHead + "Content-Length: " + strconv.Itoa(len(body)) + "\r\nTransfer-Encoding: chunked\r\n\r\n" + body
	}, nil, untouched},
	{"te-cl-hidden-acquire", func(_, r2, _ string) string {
		body := "0\r\n\r\n" + acquire(r2, closeField)
		return acquireHead + "Transfer-Encoding: chunked\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}, nil, untouched},
	{"cl-te-hidden-release", func(_, _, held string) string {
		body := "0\r\n\r\n" + release(held, closeField)
		return acquireHead + "Content-Length: " + strconv.Itoa(len(body)) + "\r\nTransfer-Encoding: chunked\r\n\r\n" + body
	}, nil, untouched},
	{"cl-xchunked-hidden-acquire", func(_, r2, _ string) string {
		body := "0\r\n\r\n" + acquire(r2, closeField)
		return acquireHead + "Content-Length: " + strconv.Itoa(len(body)) + "\r\nTransfer-Encoding: xchunked\r\n\r\n" + body
	}, nil, untouched},
	{"two-content-lengths", func(r1, r2, _ string) string {
		b := acquireBody(r1)
		return acquireHead + "Content-Length: " + strconv.Itoa(len(b)) + "\r\nContent-Length: 0\r\n\r\n" + b + acquire(r2, closeField)
	}, nil, untouched},
	// A body that holds a request is a body, read or refused, never run.
	{"body-covers-next-acquire", func(r1, r2, _ string) string {
		body := acquireBody(r1) + acquire(r2, closeField)
		return acquireHead + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n" + closeField + "\r\n" + body
	}, nil, untouched},
	{"unread-body-holds-acquire", func(r1, r2, _ string) string {
		body := acquire(r2, "")
		head := strings.Replace(acquireHead, "application/json", "text/plain", 1)
		return head + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body + acquire(r1, closeField)
	}, nil, untouched}, // refused unread (415), and the connection closed: r1 is never read
	{"release-body-holds-acquire", func(r1, r2, held string) string {
		body := acquire(r2, "")
		return release(held, "Content-Length: "+strconv.Itoa(len(body))+"\r\n") + body + acquire(r1, closeField)
	}, nil, ended}, // released, its body unread, and the connection closed
	{"release", func(_, _, held string) string { return release(held, closeField) }, nil, ended},
	{"acquire-then-release", func(r1, _, held string) string { return acquire(r1, "") + release(held, closeField) }, []int{1}, ended},
	// Head syntax Go's server refuses (but a bare LF), or the framing rules do.
	{"bare-lf", func(r1, _, _ string) string { return strings.ReplaceAll(acquire(r1, closeField), "\r\n", "\n") }, []int{1}, untouched}, // taken, as by Go's server
	{"obs-fold", func(r1, _, _ string) string { return acquire(r1, "X-A: a\r\n b\r\n"+closeField) }, nil, untouched},
	{"space-before-colon", func(r1, _, _ string) string {
		return strings.Replace(acquire(r1, closeField), "Content-Length:", "Content-Length :", 1)
	}, nil, untouched},
	{"nul-in-value", func(r1, _, _ string) string { return acquire(r1, "X-A: a\x00b\r\n"+closeField) }, nil, untouched},
	{"obs-text-in-name", func(r1, _, _ string) string { return acquire(r1, "X-\xe9: a\r\n"+closeField) }, nil, untouched},
	{"two-hosts", func(r1, _, _ string) string { return acquire(r1, "Host: other\r\n"+closeField) }, nil, untouched},
	{"cl-plus", func(r1, _, _ string) string {
		return strings.Replace(acquire(r1, closeField), "Content-Length: ", "Content-Length: +", 1)
	}, nil, untouched},
	{"te-identity", func(r1, _, _ string) string { return acquire(r1, "Transfer-Encoding: identity\r\n"+closeField) }, nil, untouched},
	{"lowercase-method", func(r1, _, _ string) string { return strings.Replace(acquire(r1, closeField), "POST", "post", 1) }, nil, untouched},
	{"garbage-after-acquire", func(r1, _, _ string) string { return acquire(r1, "") + "GARBAGE\r\n\r\n" }, []int{1}, untouched},
	{"release-bad-id-then-acquire", func(r1, _, _ string) string {
		return release("no-such-lease", "") + acquire(r1, closeField)
	}, []int{1}, untouched},
	// Renewals and revocations: Go's server parses them, behind the
	// framing rules, on a connection the loop lent it.
	{"renew", func(_, _, held string) string { return renew(held, closeField) }, nil, renewed},
	{"revoke", func(_, _, held string) string { return revoke(held, closeField) }, nil, ended},
	{"acquire-then-renew", func(r1, _, held string) string { return acquire(r1, "") + renew(held, closeField) }, []int{1}, renewed},
	{"renew-then-acquire", func(r1, _, held string) string { return renew(held, "") + acquire(r1, closeField) }, []int{1}, renewed},
	{"renew-then-revoke", func(_, _, held string) string { return renew(held, "") + revoke(held, closeField) }, nil, heldEffect{ended: true, renewed: true}},
	{"cl-te-hidden-renew", func(_, _, held string) string {
		body := "0\r\n\r\n" + renew(held, closeField)
		return acquireHead + "Content-Length: " + strconv.Itoa(len(body)) + "\r\nTransfer-Encoding: chunked\r\n\r\n" + body
	}, nil, untouched},
	{"te-cl-hidden-revoke", func(_, _, held string) string {
		body := "0\r\n\r\n" + revoke(held, closeField)
		return acquireHead + "Transfer-Encoding: chunked\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}, nil, untouched},
	{"renew-cl-te-hidden-revoke", func(_, _, held string) string {
		body := "0\r\n\r\n" + revoke(held, closeField)
		return "POST /v1/leases/" + held + "/renew HTTP/1.1\r\nHost: gw\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\nTransfer-Encoding: chunked\r\n\r\n" + body
	}, nil, untouched},
	{"revoke-two-content-lengths", func(r1, _, held string) string {
		return "POST /v1/leases/" + held + "/revoke HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n" + acquire(r1, closeField)
	}, nil, untouched},
	{"renew-body-holds-revoke", func(_, _, held string) string {
		body := revoke(held, "")
		return "POST /v1/leases/" + held + "/renew HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" + closeField + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}, nil, untouched}, // not JSON: refused (400), never run
	{"renew-obs-fold", func(_, _, held string) string { return renew(held, "X-A: a\r\n b\r\n"+closeField) }, nil, untouched},
	{"revoke-space-before-colon", func(_, _, held string) string {
		return strings.Replace(revoke(held, closeField), "Content-Length:", "Content-Length :", 1)
	}, nil, untouched},
}

// goEffects is what the requests Go's server parsed whole would have done:
// the resources their acquire bodies name, and what they did to held.
func goEffects(seen []smuggleSeen, held string) (grants []string, effect heldEffect) {
	for _, s := range accepted(seen) {
		switch {
		case s.Method == "POST" && (s.Target == "/v1/leases" || strings.HasPrefix(s.Target, "/v1/leases?")):
			var a struct{ Resource string }
			dec := json.NewDecoder(strings.NewReader(s.Body))
			if dec.Decode(&a) == nil && !dec.More() {
				grants = append(grants, a.Resource)
			}
		case s.Method == "DELETE" && s.Target == "/v1/leases/"+held,
			s.Method == "POST" && s.Target == "/v1/leases/"+held+"/revoke":
			effect.ended = true
		case s.Method == "POST" && s.Target == "/v1/leases/"+held+"/renew":
			effect.renewed = true
		}
	}
	return grants, effect
}

func TestLeaseSmugglingCorpus(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "TLS"}[tlsOn], func(t *testing.T) { testLeaseSmuggling(t, tlsOn) })
	}
}

// leaseRun sends in to the gateway (over TLS if it has it) and to Go's
// server, each on a connection of its own, holds the gateway to the
// invariants (no 5xx, every 4xx a problem document, a lease granted,
// renewed or ended only when Go's server parsed the request whole) and
// returns what it granted, of r1 and r2 (1 and 2), and what it did to held.
func (d *smuggleDiff) leaseRun(t *testing.T, in, r1, r2, held string) (granted []int, effect heldEffect) {
	t.Helper()
	before, err := d.tg.svc.Lease(t.Context(), held)
	if err != nil {
		t.Fatal(err)
	}
	gw, notProblem, _, _ := d.send(t, d.tg.addr, d.tg.tls, in)
	_, _, _, client := d.send(t, d.plain.addr, nil, in)
	// Go's server records a request before it answers it: all are in once
	// its answers are read.
	seen, raw := d.plain.take(func(x smuggleSeen) bool { return x.remote == client })
	goGrants, goEffect := goEffects(seen, held)
	for _, s := range gw {
		if s >= 500 {
			t.Errorf("the gateway answered %d (answers %v)", s, gw)
		}
	}
	if len(notProblem) > 0 {
		t.Errorf("the gateway answered %v not as problem documents (answers %v)", notProblem, gw)
	}
	for n, res := range []string{r1, r2} {
		st, err := d.tg.svc.Resource(t.Context(), res)
		if err != nil && !errors.Is(err, tokens.ErrNotFound) {
			t.Fatal(err)
		}
		if st.Token == 0 {
			continue
		}
		granted = append(granted, n+1)
		if !slices.Contains(goGrants, res) {
			t.Errorf("the gateway granted %s, which no acquire Go's server parsed whole names (it parsed %q)", res, raw)
		}
	}
	l, err := d.tg.svc.Lease(t.Context(), held)
	if err != nil {
		t.Fatal(err)
	}
	effect = heldEffect{ended: l.Released(), renewed: l.ExpiresAt.After(before.ExpiresAt)}
	if effect.ended && !goEffect.ended {
		t.Errorf("the gateway ended the held lease, which no release or revocation Go's server parsed whole names (it parsed %q)", raw)
	}
	if effect.renewed && !goEffect.renewed {
		t.Errorf("the gateway renewed the held lease, which no renewal Go's server parsed whole names (it parsed %q)", raw)
	}
	if t.Failed() {
		t.Logf("answers %v; Go's server parsed %q", gw, raw)
	}
	return granted, effect
}

func testLeaseSmuggling(t *testing.T, tlsOn bool) {
	d := newSmuggleDiff(t, 2*time.Second, tlsOn)
	for i, c := range leaseCases {
		t.Run(c.name, func(t *testing.T) {
			r1, r2 := fmt.Sprintf("ls%04d-1", i), fmt.Sprintf("ls%04d-2", i)
			held := d.tg.lease(t, fmt.Sprintf("ls%04d-0", i))
			granted, effect := d.leaseRun(t, c.in(r1, r2, held), r1, r2, held)
			if !slices.Equal(granted, c.grants) || effect != c.held {
				t.Errorf("granted %v, the held lease %+v; want %v, %+v", granted, effect, c.grants, c.held)
			}
		})
	}
}

// Any bytes, seeded with the corpus, plain and over TLS: no answer is a
// 5xx, every 4xx is a problem document, and a lease granted, renewed or
// ended is one Go's server parsed whole. The seeds name their resources
// and the held lease by placeholders of the lengths of the names each
// input gets, so a seed's Content-Length stays true once they are filled
// in.
func FuzzLeaseSmuggling(f *testing.F) {
	diffs := []*smuggleDiff{newSmuggleDiff(f, 200*time.Millisecond, false), newSmuggleDiff(f, 200*time.Millisecond, true)}
	held0 := diffs[0].tg.lease(f, "lsfuzz-held-0")
	r1, r2, held := "@@@@@@@@@@1", "@@@@@@@@@@2", strings.Repeat("%", len(held0))
	for _, c := range leaseCases {
		f.Add(c.in(r1, r2, held))
	}
	n := 0
	f.Fuzz(func(t *testing.T, raw string) {
		if len(raw) > 8<<10 {
			return
		}
		for _, d := range diffs {
			n++
			in1, in2 := fmt.Sprintf("lf%08d1", n), fmt.Sprintf("lf%08d2", n)
			id := d.tg.lease(t, fmt.Sprintf("lf%08d0", n))
			if len(id) != len(held) {
				t.Fatalf("lease ids changed length: %q", id)
			}
			in := strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(raw, r1, in1), r2, in2), held, id)
			d.leaseRun(t, in, in1, in2, id)
		}
	})
}
