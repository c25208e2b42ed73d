package gateway

// Writes to an https upstream through the engine (TLS over its own
// connections), against httputil.ReverseProxy over the Transport.

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestTLSUpstreamMatchesReverseProxy(t *testing.T) {
	countDirect(t)
	up := &diffUpstream{seen: map[string][]seenRequest{}}
	up.Server = httptest.NewTLSServer(http.HandlerFunc(up.serve))
	t.Cleanup(up.Close)
	upTLS := up.Client().Transport.(*http.Transport).TLSClientConfig
	eng := startFraming(t, up.URL, Config{}, false)
	std := startFraming(t, up.URL, Config{}, false)
	eng.g.transport.TLSClientConfig, std.g.transport.TLSClientConfig = upTLS, upTLS
	useReverseProxy(std)
	var dials atomic.Int64
	dial := eng.g.transport.DialContext
	eng.g.transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	el, sl := eng.leaseTTL(t, "r", time.Hour), std.leaseTTL(t, "r", time.Hour)
	c := diffClient(t)
	h := headerOf
	cases := []diffCase{
		{method: "POST", path: "/plain?a=1;b", body: "small body"},
		{method: "PUT", path: "/plain", body: strings.Repeat("b", smallBody+1)},
		{method: "PATCH", path: "/plain", body: "streamed", chunked: true},
		{method: "POST", path: "/plain", body: "x", header: h("Expect", "100-continue")},
		{method: "GET", path: "/big"},
		{method: "POST", path: "/chunked", body: "x", header: h("Te", "trailers")},
		{method: "POST", path: "/early", body: "x"},
		{method: "POST", path: "/close", body: "x"},
		{method: "DELETE", path: "/plain"},
	}
	for i, dc := range cases {
		compare(t, up, eng, std, el, sl, c, "tls-"+strconv.Itoa(i), dc)
	}
	if n := directs.Load(); n != int64(len(cases)) {
		t.Errorf("%d of %d writes to an https upstream took the engine's road, want all", n, len(cases))
	}
	// One connection for writes one after the other, but after /close
	// (its answer says Connection: close).
	if n := dials.Load(); n != 2 {
		t.Errorf("%d writes to an https upstream dialled %d connections, want 2 (one kept alive, one after Connection: close)", len(cases), n)
	}
}
