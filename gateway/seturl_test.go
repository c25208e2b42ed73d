package gateway

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"reflect"
	"testing"
)

// setUpstreamURL sets what ProxyRequest.SetURL sets, for every upstream
// and path: its shortcut (an upstream of a scheme and a host alone) and
// the rest.
func TestSetUpstreamURLIsSetURL(t *testing.T) {
	upstreams := []string{"http://up:8080", "https://up", "http://up:8080/", "http://up/base", "http://up/base/",
		"http://up/a%2Fb", "http://up?x=1", "http://up/base?x=1&y", "http://user:pw@up:1", "http://[::1]:80"}
	targets := []struct{ path, rawPath, query string }{
		{"/w", "", ""}, {"/", "", ""}, {"/w/x", "", "a=1&b=2"}, {"/a b", "", ""}, {"/a/b", "/a%2Fb", ""},
		{"", "", ""}, {"w", "", "q"}, {"//w", "", ""}, {"/w;x", "", ";"}, {"/é", "", ""},
	}
	for _, up := range upstreams {
		target, err := url.Parse(up)
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range targets {
			want, got := requestFor(tg.path, tg.rawPath, tg.query), requestFor(tg.path, tg.rawPath, tg.query)
			(&httputil.ProxyRequest{In: want, Out: want}).SetURL(target)
			setUpstreamURL(&httputil.ProxyRequest{In: got, Out: got}, target)
			if !reflect.DeepEqual(got.URL, want.URL) || got.Host != want.Host {
				t.Errorf("upstream %s, path %q (raw %q), query %q: URL %#v, Host %q; SetURL's %#v, %q",
					up, tg.path, tg.rawPath, tg.query, got.URL, got.Host, want.URL, want.Host)
			}
		}
	}
}

func requestFor(path, rawPath, query string) *http.Request {
	return &http.Request{Host: "client.example", URL: &url.URL{Path: path, RawPath: rawPath, RawQuery: query}}
}
