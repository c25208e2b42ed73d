package e2e

// A viewer's fenced write across replicas: refused before the upstream,
// and recorded in the one rejection log every replica shows.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// A viewer key that writes through replica 2 with a lease replica 1
// granted is answered 403 forbidden, and the upstream sees nothing; the
// refusal is recorded as a forbidden write by the viewer under that
// lease (its resource, holder and token), shown live on replica 1's
// rejection stream (the dashboard's feed) and in its rejection log, and
// counted in replica 2's metrics. The holder's own write through
// replica 2 then goes through. (The embedded mode:
// gateway.TestViewerWriteIsRefusedAndRecorded.)
func TestSecurityViewerWriteAcrossReplicas(t *testing.T) {
	for _, m := range sharedStoreModes("fencegw-e2e-viewer:") {
		t.Run(m.name, func(t *testing.T) {
			pgtest.Require(t)
			schema := pgtest.NewSchema(t)
			up := newUpstream(t)
			ups := map[string]string{"statements": up.URL}
			var gws []*gw
			for i := range 2 {
				gws = append(gws, startSecure(t, pgMode(t, m.config(t, schema), i), ups, secureOptions{}))
			}
			one, two := gws[0].URL, gws[1].URL
			res := "stmt:viewer:" + m.name
			l := acquireAs(t, one, keyWorkerA, res, time.Minute)
			// The schema is this test's: every rejection in it is this
			// test's, so neither the stream nor the log is filtered (a
			// refusal recorded without its lease's resource shows too).
			live := rejectionStream(t, one, keyViewer)

			wantProblem(t, writeAs(t, two, keyViewer, "/ledger", l, "viewer's line"), http.StatusForbidden, "forbidden")
			if n := len(up.seen()); n != 0 {
				t.Fatalf("%d writes reached the upstream, want none", n)
			}
			wantViewerRefusal := func(where string, r rejectionJSON) {
				t.Helper()
				if r.Code != "forbidden" || r.Principal != "viewer" || r.Resource != res || r.Holder != l.Holder ||
					r.Token != l.Token || r.CurrentToken != l.Token || r.Method != "POST" || r.Upstream != "statements" || r.Path != "/ledger" {
					t.Fatalf("%s shows %+v; want the viewer's forbidden POST to statements/ledger under token %d held by %s",
						where, r, l.Token, l.Holder)
				}
			}
			select {
			case r := <-live:
				wantViewerRefusal("replica 1's live stream", r)
			case <-time.After(30 * time.Second):
				t.Fatal("replica 1's live stream never showed the refusal made on replica 2")
			}
			// The log's record may come after the answer (late.go).
			deadline := time.Now().Add(10 * time.Second)
			for {
				rs := listRejectionsAs(t, one, keyViewer)
				if len(rs.Items) == 1 {
					wantViewerRefusal("replica 1's rejection log", rs.Items[0])
					break
				}
				if len(rs.Items) > 1 || time.Now().After(deadline) {
					t.Fatalf("replica 1's rejection log: %+v; want the viewer's one refusal", rs.Items)
				}
				time.Sleep(100 * time.Millisecond)
			}
			metrics := scrape(t, two, bearer(keyViewer)...)
			wantSeries(t, metrics, `fencegw_rejections_total{reason="forbidden"}`, 1)
			wantSeries(t, metrics, `fencegw_rejections_by_principal_total{principal="viewer",reason="forbidden"}`, 1)

			if a := writeAs(t, two, keyWorkerA, "/ledger", l, "holder's line"); a.Status != http.StatusOK {
				t.Fatalf("the holder's write after the viewer's: %d %s", a.Status, a.Body)
			}
			if seen := up.seen(); len(seen) != 1 || seen[0].Body != "holder's line" || seen[0].Token != l.Token {
				t.Fatalf("the upstream saw %+v; want only the holder's write, with token %d", seen, l.Token)
			}
		})
	}
}

// listRejectionsAs is base's rejection log, read with key.
func listRejectionsAs(t *testing.T, base, key string) rejectionsJSON {
	t.Helper()
	a := do(t, "GET", base+"/v1/rejections", nil, bearer(key)...)
	var rs rejectionsJSON
	if a.Status != http.StatusOK {
		t.Fatalf("rejections: %d %s", a.Status, a.Body)
	}
	if err := json.Unmarshal(a.Body, &rs); err != nil {
		t.Fatalf("rejections %s: %v", a.Body, err)
	}
	return rs
}

// rejectionStream follows base's live rejection stream, read with key,
// from now on (no replay), as the dashboard does, and sends its rejection
// events until the test ends. It returns once the stream is open:
// rejections from then on are on it.
func rejectionStream(t *testing.T, base, key string) <-chan rejectionJSON {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/rejections/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	// Not httpClient: its timeout would cut a stream that outlives it.
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("rejection stream: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("rejection stream: %d", resp.StatusCode)
	}
	out := make(chan rejectionJSON, 16)
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				event = ""
			case strings.HasPrefix(line, "event: "):
				event = line[len("event: "):]
			case strings.HasPrefix(line, "data: ") && event == "rejection":
				var r rejectionJSON
				if err := json.Unmarshal([]byte(line[len("data: "):]), &r); err != nil {
					r.Code = fmt.Sprintf("undecodable event %q: %v", line, err)
				}
				select {
				case out <- r:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}
