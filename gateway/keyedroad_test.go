package gateway

// Keyed writes (Idempotency-Key) on the direct forward, against the
// reverse proxy: the same request at the upstream, the same answer at the
// client, the same replay of it.

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

func TestKeyedWritesMatchReverseProxy(t *testing.T) {
	up, eng, std, el, sl := startDiffWith(t, func(store *bolt.Store, cfg *Config, _ *http.Server) {
		// A small replay limit, so that some answers are recorded whole
		// and some without their body.
		cfg.Idempotency = tokens.NewIdempotency(tokens.IdempotencyConfig{Store: store, InFlight: time.Minute, MaxBody: 64})
	})
	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	cases := []diffCase{
		{method: "POST", path: "/plain", body: "small body"},
		{method: "POST", path: "/plain?a=1;b=2&c=%zz", body: "x"},
		{method: "PUT", path: "/plain/a%2Fb", body: strings.Repeat("b", smallBody+1)},
		{method: "PATCH", path: "/plain", body: "streamed", chunked: true},
		{method: "POST", path: "/plain", body: ""},
		{method: "DELETE", path: "/plain"},
		{method: "POST", path: "/chunked", body: "x"},
		{method: "POST", path: "/big", body: "x"},
		{method: "POST", path: "/early", body: "x"},
		{method: "POST", path: "/events", body: "x"},
		{method: "POST", path: "/close", body: "x"},
		{method: "POST", path: "/nolength", body: "x"},
		{method: "POST", path: "/status/500", body: "x"},
		{method: "POST", path: "/status/503", body: "x"},
	}
	for i, dc := range cases {
		id := "keyed-" + strconv.Itoa(i)
		dc.header = http.Header{HeaderIdempotencyKey: {`"` + id + `"`}}
		compare(t, up, eng, std, el, sl, c, id, dc)
		// A retry with the key: answered from each gateway's record (or
		// forwarded again, for an answer that is not recorded), alike.
		ae := eng.send(t, c, el, id+"/engine", dc)
		as := std.send(t, c, sl, id+"/std", dc)
		se, ss := up.take(id+"/engine"), up.take(id+"/std")
		if len(se) != len(ss) || fmt.Sprint(ae) != fmt.Sprint(as) {
			t.Errorf("%s: the retry reached the upstream %d times through the engine and %d through the Transport; the client got, through the engine:\n%+v\nthrough the Transport:\n%+v", id, len(se), len(ss), ae, as)
		}
	}
	if n := directs.Load(); n < int64(len(cases))/2 {
		t.Errorf("%d of %d keyed writes took the direct forward, want most", n, len(cases))
	}
}
