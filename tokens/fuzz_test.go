package tokens

import (
	"strings"
	"testing"
)

func FuzzValidateResource(f *testing.F) {
	for _, s := range []string{"stmt:acct:88213", "inventory/SKU-001", "", "a b", "<script>", strings.Repeat("x", 257), "ü", "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := DefaultLimits.ValidateResource(name)
		valid := len(name) >= 1 && len(name) <= 256
		for i := 0; i < len(name); i++ {
			valid = valid && strings.IndexByte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:@/-", name[i]) >= 0
		}
		if (err == nil) != valid {
			t.Fatalf("ValidateResource(%q) = %v, want valid=%v", name, err, valid)
		}
	})
}

func FuzzValidateHolder(f *testing.F) {
	for _, s := range []string{"worker-3", "", "<script>alert(1)</script>", "\xff", "tab\there", strings.Repeat("h", 129)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, holder string) {
		if err := DefaultLimits.ValidateHolder(holder); err == nil && len(holder) > 128 {
			t.Fatalf("accepted a %d-byte holder", len(holder))
		}
	})
}
