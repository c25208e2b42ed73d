package engine

import (
	"bufio"
	"io"
	"strings"
	"testing"
)

func TestStatusLineKinds(t *testing.T) {
	for _, tc := range []struct {
		line        string
		final, info bool
	}{
		{"HTTP/1.1 200 OK", true, false},
		{"HTTP/1.0 413 x", true, false},
		{"HTTP/1.1 999 x", true, false},
		{"HTTP/1.1 100 Continue", false, true},
		{"HTTP/1.1 103 Early Hints", false, true},
		{"HTTP/1.1 199 x", false, true},
		{"HTTP/1.1 101 Switching Protocols", false, false},
		{"HTTP/1.1 1x3 x", false, false},
		{"HTTP/2.0 200 x", false, false},
		{"HTTP/1.1 099 x", false, false},
		{"HTTP/1.1 20", false, false},
	} {
		b := []byte(tc.line)
		if got := finalStatusLine(b); got != tc.final {
			t.Errorf("finalStatusLine(%q) = %v", tc.line, got)
		}
		if got := informationalStatusLine(b); got != tc.info {
			t.Errorf("informationalStatusLine(%q) = %v", tc.line, got)
		}
	}
}

// headEnd finds the end of a head that arrives in pieces, consuming
// nothing, and gives up on a head larger than the buffer.
func TestHeadEnd(t *testing.T) {
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pr.Close() })
	br := bufio.NewReaderSize(pr, 64)
	go func() {
		for _, s := range []string{"HTTP/1.1 103 Early Hints\r\n", "Link: <a>\r", "\n\r\n", "HTTP/1.1 200 OK\r\n\r\n"} {
			_, _ = io.WriteString(pw, s)
		}
		_, _ = io.WriteString(pw, "HTTP/1.1 103 x\r\n"+strings.Repeat("x", 100))
	}()
	first := len("HTTP/1.1 103 Early Hints\r\nLink: <a>\r\n\r\n")
	if _, err := br.Peek(12); err != nil {
		t.Fatal(err)
	}
	if got := headEnd(br, 0); got != first {
		t.Fatalf("headEnd = %d, want %d", got, first)
	}
	if got := headEnd(br, first); got != first+len("HTTP/1.1 200 OK\r\n\r\n") {
		t.Fatalf("second headEnd = %d", got)
	}
	if b, _ := br.Peek(first); string(b[:12]) != "HTTP/1.1 103" {
		t.Fatalf("the buffer was consumed: %q", b)
	}
	_, _ = br.Discard(first + len("HTTP/1.1 200 OK\r\n\r\n"))
	if got := headEnd(br, 0); got != -1 {
		t.Fatalf("headEnd of a head over the buffer = %d, want -1", got)
	}
}

// A 1xx head with a bare LF is not looked past: where it ends is
// ReadResponse's to say, and a CRLFCRLF further on may be a later head's.
func TestHeadEndBareLF(t *testing.T) {
	br := bufio.NewReaderSize(strings.NewReader("HTTP/1.1 103 x\nLink: <a>\n\nHTTP/1.1 200 OK\r\n\r\n"), 64)
	if _, err := br.Peek(12); err != nil {
		t.Fatal(err)
	}
	if got := headEnd(br, 0); got != -1 {
		t.Fatalf("headEnd of a bare-LF head = %d, want -1", got)
	}
}
