package wire

import (
	"bufio"
	"bytes"
	"net/http"
	"net/textproto"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

// fieldsOf builds a header from text: lines "name=value" (a name may come
// back: a second value), for the fuzzer to vary names and values freely.
func fieldsOf(text string) http.Header {
	h := http.Header{}
	for _, line := range strings.Split(text, "|") {
		name, value, _ := strings.Cut(line, "=")
		h[name] = append(h[name], value)
	}
	return h
}

func writeBoth(t *testing.T, h http.Header, exclude ...string) {
	t.Helper()
	var excludeMap map[string]bool
	for _, k := range exclude {
		if excludeMap == nil {
			excludeMap = map[string]bool{}
		}
		excludeMap[k] = true
	}
	var want bytes.Buffer
	if err := h.WriteSubset(&want, excludeMap); err != nil {
		t.Fatal(err)
	}
	// A small buffer too, for lines that do not fit its free space.
	for _, size := range []int{4096, 16} {
		var got bytes.Buffer
		bw := bufio.NewWriterSize(&got, size)
		WriteFields(bw, h, exclude)
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Fatalf("WriteFields (a %d-byte buffer) wrote\n%q\nWriteSubset\n%q", size, got.String(), want.String())
		}
	}
}

// FuzzWriteFieldsMatchesWriteSubset: the same bytes as net/http's, for any
// header, with and without names excluded.
func FuzzWriteFieldsMatchesWriteSubset(f *testing.F) {
	for _, s := range []string{
		"Content-Type=application/json|Content-Length=11|Date=Sat, 05 Dec 2026 01:00:00 GMT",
		"X-A=1|X-A=2|x-a=3|X-B= \t padded \t ",
		"X-Split=a\r\nInjected: yes|Bad Name=v|=empty|X-Nul=a\x00b",
		"A=1|B=2|C=3|D=4|E=5|F=6|G=7|H=8|I=9|J=10|K=11|L=12|M=13|N=14|O=15|P=16|Q=17|R=18",
		"Transfer-Encoding=chunked|Content-Length=5|X-Caf\xc3\xa9=\xff",
		// lines of 15, 16 and 17 bytes (writeBoth's small buffer is 16), one
		// not plain
		"X-A=12345678|X-B=123456789|X-C=1234567890|X-D= 12345678",
		"Date=Sat, 05 Dec 2026 01:00:00 GMT, a value longer than a small buffer|A=1|B=2",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		h := fieldsOf(text)
		writeBoth(t, h)
		writeBoth(t, h, []string{}...) // empty, not nil
		writeBoth(t, h, "Content-Length", "Transfer-Encoding")
		writeBoth(t, h, "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer")
	})
}

// FuzzCanonicalKey: CanonicalKey is CanonicalMIMEHeaderKey, also for the
// names it takes as they are.
func FuzzCanonicalKey(f *testing.F) {
	for _, s := range []string{"Host", "host", "Content-Length", "content-length", "CONTENT-TYPE", "Etag", "ETag",
		"Fencing-Lease", "fencing-lease", "X-Forwarded-For", "Bad Name", "Accept-Encoding", "Traceparent", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if got, want := CanonicalKey(name), textproto.CanonicalMIMEHeaderKey(name); got != want {
			t.Fatalf("CanonicalKey(%q) = %q; CanonicalMIMEHeaderKey says %q", name, got, want)
		}
	})
}

// TestWriteFieldsAtEveryFreeSpace: a head written into every free space
// from 0 to more than it needs (a writer of each size, after a part of
// another head), so that its lines fill the space exactly, do not fit by
// a byte, or go out after a flush, is WriteSubset's, from a map and from
// a list.
func TestWriteFieldsAtEveryFreeSpace(t *testing.T) {
	h := fieldsOf("Content-Type=application/json|Content-Length=11|Date=Sat, 05 Dec 2026 01:00:00 GMT|X-Split=a\r\nb|X-A=1|X-A=2")
	exclude := []string{"Content-Length"}
	var want bytes.Buffer
	if err := h.WriteSubset(&want, map[string]bool{"Content-Length": true}); err != nil {
		t.Fatal(err)
	}
	for size := 16; size <= want.Len()+32; size++ {
		for used := range size {
			for name, write := range map[string]func(*bufio.Writer){
				"WriteFields": func(bw *bufio.Writer) { WriteFields(bw, h, exclude) },
				"WriteSorted": func(bw *bufio.Writer) { WriteSorted(bw, FieldsOf(h), exclude) },
			} {
				var got bytes.Buffer
				bw := bufio.NewWriterSize(&got, size)
				_, _ = bw.WriteString(strings.Repeat("x", used))
				write(bw)
				_ = bw.Flush()
				if got.String()[used:] != want.String() {
					t.Fatalf("%s, %d bytes free of %d, wrote\n%q\nWriteSubset\n%q", name, size-used, size, got.String()[used:], want.String())
				}
			}
		}
	}
}

func TestWriteFieldsEmpty(t *testing.T) {
	writeBoth(t, http.Header{})
	writeBoth(t, nil)
}

func BenchmarkWriteFields(b *testing.B) {
	h := fieldsOf("Content-Type=application/json|Content-Length=11|Date=Sat, 05 Dec 2026 01:00:00 GMT|X-Request-Id=abc")
	bw := bufio.NewWriterSize(nil, 4096)
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			bw.Reset(nil)
			WriteFields(bw, h, nil)
		}
	})
	b.Run("WriteSubset", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			bw.Reset(nil)
			_ = h.WriteSubset(bw, nil)
		}
	})
}

// headEndByByte is HeadEnd as a plain loop over every byte: the reference
// HeadEnd's jumps from LF to LF are held to.
func headEndByByte(buf []byte) int {
	for i := 0; i < len(buf); i++ {
		if buf[i] != '\n' {
			continue
		}
		if i == 0 || buf[i-1] != '\r' {
			return -1
		}
		if i >= 3 && buf[i-2] == '\n' && buf[i-3] == '\r' {
			return i + 1
		}
	}
	return 0
}

func FuzzHeadEnd(f *testing.F) {
	for _, s := range []string{"", "\n", "\r\n", "\r\n\r\n", "GET / HTTP/1.1\r\nHost: a\r\n\r\nbody",
		"GET / HTTP/1.1\r\nHost: a\n\r\n", "GET / HTTP/1.1\r\nHost: a\r\n\n", "GET / HTTP/1.1\r\nHost: a\r\n",
		"\r\n\r\n\r\n", "a\r\n\r", "GET / HTTP/1.1\r\nA: \r\r\n\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, buf []byte) {
		if got, want := HeadEnd(buf), headEndByByte(buf); got != want {
			t.Fatalf("HeadEnd(%q) = %d, want %d", buf, got, want)
		}
	})
}

// FuzzValidName holds ValidName to httpguts.ValidHeaderFieldName.
func FuzzValidName(f *testing.F) {
	for _, s := range []string{"", "Content-Type", "X_A", "a b", "é", "\xff", "X-\x80", "~!#$%&'*+-.^_`|", "(", "A\x00",
		// ValidName's names taken at once (each seed is run by go test).
		"Content-Length", "Accept-Encoding", "Date", "Fencing-Token", "Fencing-Resource", "X-Forwarded-For",
		"X-Forwarded-Host", "X-Forwarded-Proto", "Traceparent"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if got, want := ValidName(name), httpguts.ValidHeaderFieldName(name); got != want {
			t.Fatalf("ValidName(%q) = %v, want %v", name, got, want)
		}
	})
}

// FuzzValue holds Value to what net/http writes of a value (WriteSubset:
// CR and LF to spaces, then textproto.TrimString), and plain to Value's
// leaving the value as it is whenever it says so.
func FuzzValue(f *testing.F) {
	for _, s := range []string{"", " ", "a", "application/json", " a", "a ", "a\t", "\ta", "01234567", "0123456\r",
		"0123456789abcdef\n", "0123456789abcde\x1f", "é€ and more than eight", "\x7f\x80\xff01234567", "a\x00b",
		"a\r\nb", "01234567 ", " 01234567", "0123456789\t",
		// plain's last eight bytes, overlapping the eight before
		"0123456\x01", "01234567\x01", "\x0101234567", "0123456\x0089", "01234567890123\x00", "012345678901234\x00",
		"0123456789abcdef", "0123456789abcdef\x1f", "\t0123456"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		want := textproto.TrimString(strings.NewReplacer("\n", " ", "\r", " ").Replace(v))
		if got := Value(v); got != want {
			t.Fatalf("Value(%q) = %q, want %q", v, got, want)
		}
		if plain(v) && want != v {
			t.Fatalf("plain(%q), but net/http writes %q", v, want)
		}
	})
}

// FuzzUnprintable holds Unprintable's eight-byte blocks to a search one
// byte at a time, from every start.
func FuzzUnprintable(f *testing.F) {
	f.Add([]byte("0123456789abcdef\tghijklmnop"))
	f.Add([]byte("01234567\x80abcdefgh\x7f"))
	f.Add([]byte(" ~~~~~~~~~~~~~~~~\x1f"))
	f.Add([]byte("\xff~~~~~~~\x00"))
	f.Add([]byte("~~~~~~~~~~~~~~~\r\n"))
	f.Fuzz(func(t *testing.T, v []byte) {
		for i := 0; i <= len(v); i++ {
			want := len(v)
			for j := i; j < len(v); j++ {
				if v[j] < ' ' || v[j] > 0x7e {
					want = j
					break
				}
			}
			if got := Unprintable(v, i); got != want {
				t.Fatalf("Unprintable(%q, %d) = %d, want %d", v, i, got, want)
			}
		}
	})
}
