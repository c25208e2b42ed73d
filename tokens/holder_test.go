package tokens

import "testing"

// Holder labels that would read as something else on the
// dashboard are refused.
func TestValidateHolderRefusesSpoofing(t *testing.T) {
	for _, h := range []string{"worker-1", "wörker-Ω", "作業者", "w 1", "📦"} {
		if err := DefaultLimits.ValidateHolder(h); err != nil {
			t.Errorf("%q: %v", h, err)
		}
	}
	for _, h := range []string{"w\u202Eexe", "w\u2066x\u2069", "w\u200Bx", "w\u200Dx", "w\uFEFF", "w\u00ADx", "w\u2028x", "w\u0085x", "w\u061Cx", "w\u200Fx", "w\x01", "w\xff"} {
		if err := DefaultLimits.ValidateHolder(h); err == nil {
			t.Errorf("%q accepted", h)
		}
	}
}
