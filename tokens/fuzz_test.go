package tokens

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
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

// FuzzValidateHolder checks the holder rule against its statement, written
// out independently of ValidateHolder: at most 128 bytes of UTF-8, with no
// control character (C0, DEL, C1), no format character (Cf: bidi controls,
// zero-width characters, soft hyphen, BOM), no line or paragraph separator
// and no replacement character.
func FuzzValidateHolder(f *testing.F) {
	for _, s := range []string{"worker-3", "", "<script>alert(1)</script>", "\xff", "tab\there", strings.Repeat("h", 129),
		"wörker", "工作者", "worker-1\u202Eexe.dat", "a\u200Bb", "soft\u00ADhyphen", "\uFEFFbom", "line\u2028sep", "para\u2029sep",
		"nel\u0085", "del\x7f", "\uFFFD", "emoji 🚀", strings.Repeat("ü", 64), strings.Repeat("ü", 65)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, holder string) {
		valid := len(holder) <= 128 && utf8.ValidString(holder)
		for _, r := range holder {
			switch {
			case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f: // C0, DEL, C1
				valid = false
			case unicode.Is(unicode.Cf, r), r == '\u2028', r == '\u2029', r == utf8.RuneError:
				valid = false
			}
		}
		if err := DefaultLimits.ValidateHolder(holder); (err == nil) != valid {
			t.Fatalf("ValidateHolder(%q) = %v, want valid=%v", holder, err, valid)
		}
	})
}
