package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// Live streams are capped in all and per key; a freed
// slot can be taken again.
func TestStreamCaps(t *testing.T) {
	up := newRecorder(t)
	keys := keyring{"k1": {Name: "one", Role: RoleViewer}, "k2": {Name: "two", Role: RoleViewer}, "k3": {Name: "three", Role: RoleViewer}}
	tg := startFraming(t, up.URL, Config{Auth: keys, MaxStreams: 4, MaxStreamsPerKey: 2}, false)
	open := func(key string) (net.Conn, int) {
		c := tg.dial(t)
		_, _ = io.WriteString(c, "GET /v1/rejections/stream HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "+key+"\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
		return c, resp.StatusCode
	}
	first, _ := open("k1")
	for i, tc := range []struct {
		key  string
		want int
	}{{"k1", 200}, {"k1", 429}, {"k2", 200}, {"k2", 200}, {"k3", 429}} {
		if _, got := open(tc.key); got != tc.want {
			t.Fatalf("stream %d of %s: %d, want %d", i+2, tc.key, got, tc.want)
		}
	}
	_ = first.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, got := open("k3")
		if got == 200 {
			break
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the closed stream's slot was not freed")
		}
	}
}
