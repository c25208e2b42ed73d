package gateway

import "testing"

// A control body is one JSON value: anything after it is refused, naming
// where; a value that does not parse is left to the generated decoder.
func TestOneJSONValue(t *testing.T) {
	for body, wantErr := range map[string]bool{
		`{"resource":"r","ttl_ms":1000}`:   false,
		" \n{\"resource\":\"r\"}\t\r\n ":   false,
		`[]`:                               false,
		`{`:                                false, // the generated decoder names the error
		``:                                 false,
		`{"resource":"r"}{"resource":"q"}`: true,
		`{"resource":"r"} garbage`:         true,
		`{"resource":"r"}]`:                true,
		`1 2`:                              true,
	} {
		err := oneJSONValue([]byte(body))
		if (err != nil) != wantErr {
			t.Errorf("oneJSONValue(%q) = %v, want error: %v", body, err, wantErr)
		}
	}
}

func TestOneJSONValueOfAValidBodyAllocatesNothing(t *testing.T) {
	body := []byte(`{"resource":"accounts/42","holder":"worker-7","ttl_ms":30000}`)
	if n := testing.AllocsPerRun(100, func() { _ = oneJSONValue(body) }); n != 0 {
		t.Errorf("%v allocations per valid body, want 0", n)
	}
}
