package wire

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
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

func writeBoth(t *testing.T, h http.Header, exclude map[string]bool) {
	t.Helper()
	var want bytes.Buffer
	if err := h.WriteSubset(&want, exclude); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	bw := bufio.NewWriter(&got)
	WriteFields(bw, h, exclude)
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Fatalf("WriteFields wrote\n%q\nWriteSubset\n%q", got.String(), want.String())
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
	} {
		f.Add(s)
	}
	exclude := map[string]bool{"Content-Length": true, "Transfer-Encoding": true}
	f.Fuzz(func(t *testing.T, text string) {
		h := fieldsOf(text)
		writeBoth(t, h, nil)
		writeBoth(t, h, exclude)
	})
}

func TestWriteFieldsEmpty(t *testing.T) {
	writeBoth(t, http.Header{}, nil)
	writeBoth(t, nil, nil)
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
