package gateway

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

// jsonMediaType answers as mime.ParseMediaType does for every
// Content-Type, the one it tells by itself included.
func TestJSONMediaTypeAgreesWithParseMediaType(t *testing.T) {
	for _, ct := range []string{
		"application/json", "application/json; charset=utf-8", "Application/JSON", "application/json ",
		"application/problem+json", "application/json;", "application/json; charset", "application/jsonx",
		"text/json", "text/plain", "", " ", "application/", "application/json, text/plain", `application/json; a="`,
	} {
		mt, _, err := mime.ParseMediaType(ct)
		want := err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
		if got := jsonMediaType(ct); got != want {
			t.Errorf("jsonMediaType(%q) = %v, ParseMediaType says %v", ct, got, want)
		}
	}
}

// readWhole reads what io.ReadAll reads, whatever the announced length
// says and however the reader splits its data, and passes its errors on.
func TestReadWholeAsReadAll(t *testing.T) {
	data := []byte(`{"resource":"accounts/42","holder":"worker-7","ttl_ms":30000}`)
	for _, length := range []int64{-1, 0, 1, int64(len(data)) - 1, int64(len(data)), int64(len(data)) + 1, 4096} {
		for name, r := range map[string]func() io.Reader{
			"whole":    func() io.Reader { return bytes.NewReader(data) },
			"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) },
			"data+EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(data)) },
		} {
			got, err := readWhole(r(), length)
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("%s, length %d: %q, %v; want %q", name, length, got, err, data)
			}
		}
	}
	boom := errors.New("boom")
	got, err := readWhole(io.MultiReader(bytes.NewReader(data[:10]), iotest.ErrReader(boom)), int64(len(data)))
	if !errors.Is(err, boom) || !bytes.Equal(got, data[:10]) {
		t.Errorf("failing reader: %q, %v; want %q, %v", got, err, data[:10], boom)
	}
	// The size limit stays the body's own.
	limited := http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(bytes.NewReader(data)), 8)
	var maxBytes *http.MaxBytesError
	if _, err := readWhole(limited, int64(len(data))); !errors.As(err, &maxBytes) {
		t.Errorf("over the limit: %v, want a MaxBytesError", err)
	}
}

func TestReadWholeOfAnAnnouncedBodyAllocatesOnce(t *testing.T) {
	data := []byte(`{"resource":"accounts/42","holder":"worker-7","ttl_ms":30000}`)
	r := bytes.NewReader(data)
	n := testing.AllocsPerRun(100, func() {
		r.Reset(data)
		if _, err := readWhole(r, int64(len(data))); err != nil {
			t.Fatal(err)
		}
	})
	if n != 1 {
		t.Errorf("%v allocations per body, want 1", n)
	}
}
