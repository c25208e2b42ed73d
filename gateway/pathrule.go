package gateway

import (
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// The path rule (docs/security.md, "Paths"): the path below
// /v1/proxy/{upstream}/ is forwarded only if every upstream reads it the
// same way, so that the path the gateway checked, routed and logged is the
// path the upstream acts on. Upstreams differ: Tomcat and Spring drop
// ";parameters" before resolving dot segments (/base/..;/escape), IIS and
// many Windows stacks take '\' for '/', some frameworks decode twice
// (%252e%252e becomes ..), lenient decoders accept overlong UTF-8 (%c0%ae is
// '.') and some normalise Unicode (NFKC turns U+FF0E into '.'). The path,
// percent-decoded once, is refused with 400 invalid_request (field path) if
//
//   - a segment, with anything from its first ';' cut off, is made only of
//     dots and spaces and has a dot (".", "..", "..;x", ". .", "..."), in any
//     percent-encoding, and counting as spaces the Unicode spaces NFKC turns
//     into one (U+00A0, U+2000-U+200A, ...: nfkcSpace);
//   - it has a backslash (raw or %5c);
//   - it has a '%' (an encoded percent, %25: a second decoding would change
//     the path);
//   - it is not valid UTF-8 (overlong forms such as %c0%ae included);
//   - it has a character whose Unicode compatibility form (NFKC) holds a
//     '.', '/', '\', ';' or '%' (fullwidth and small forms, dot leaders,
//     U+2025 "..", U+2105 "c/o": 44 characters, see nfkcUnsafe);
//   - it has a control character (C0, DEL).
//
// The common path (ASCII, no '%') is checked in one pass without
// allocating.

// Details of path refusals.
const (
	pathDotSegment = "must not contain dot segments (., .., ..;x, in any encoding)"
	pathBackslash  = "must not contain a backslash (raw or %5c)"
	pathPercent    = "must not contain an encoded percent (%25): upstreams that decode twice would read another path"
	pathUTF8       = "must be valid UTF-8 once decoded (no overlong forms like %c0%ae)"
	pathLookalike  = "must not contain characters that Unicode normalisation (NFKC) turns into '.', '/', '\\', ';' or '%'"
	pathControl    = "must not contain control characters"
)

// checkProxyPath applies the path rule to raw, the escaped path below the
// upstream (starting with '/'), and returns it decoded.
func checkProxyPath(raw string) (string, error) {
	path := raw
	if strings.IndexByte(raw, '%') >= 0 {
		var err error
		if path, err = url.PathUnescape(raw); err != nil {
			return "", tokens.Invalid("path", "is not a valid percent-encoded path")
		}
		if strings.IndexByte(path, '%') >= 0 {
			return "", tokens.Invalid("path", pathPercent)
		}
	}
	ascii := true
	start := 0
	for i := 0; i <= len(path); i++ {
		if i == len(path) || path[i] == '/' {
			if dotSegment(path[start:i]) {
				return "", tokens.Invalid("path", pathDotSegment)
			}
			start = i + 1
			continue
		}
		switch c := path[i]; {
		case c < 0x20 || c == 0x7f:
			return "", tokens.Invalid("path", pathControl)
		case c == '\\':
			return "", tokens.Invalid("path", pathBackslash)
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	if !ascii {
		if !utf8.ValidString(path) {
			return "", tokens.Invalid("path", pathUTF8)
		}
		for _, r := range path {
			if nfkcUnsafe(r) {
				return "", tokens.Invalid("path", pathLookalike)
			}
		}
		// A Unicode space that NFKC turns into ' ' beside a dot: ". "
		// reads as ". " once normalised, which Windows trims to ".".
		for seg := range strings.SplitSeq(path, "/") {
			if dotSegmentNFKC(seg) {
				return "", tokens.Invalid("path", pathDotSegment)
			}
		}
	}
	return path, nil
}

// nfkcSpace reports whether r (not ASCII) is one of the spaces whose NFKC
// form is ' ' (TestNFKCSpaceIsComplete derives the list from
// golang.org/x/text).
func nfkcSpace(r rune) bool {
	return r == 0x00A0 || 0x2000 <= r && r <= 0x200A || r == 0x202F || r == 0x205F || r == 0x3000
}

// dotSegmentNFKC is dotSegment for seg once NFKC-normalised: a segment of
// dots and spaces, those of nfkcSpace included, with at least one dot.
func dotSegmentNFKC(seg string) bool {
	dot := false
	for _, r := range seg {
		switch {
		case r == ';':
			return dot
		case r == '.':
			dot = true
		case r == ' ' || nfkcSpace(r):
		default:
			return false
		}
	}
	return dot
}

// nfkcUnsafe reports whether r's NFKC form holds '.', '/', '\', ';' or
// '%' (TestNFKCUnsafeIsComplete derives the list from golang.org/x/text).
func nfkcUnsafe(r rune) bool {
	switch {
	case r < 0x037E:
		return false
	case r == 0x037E, 0x2024 <= r && r <= 0x2026, r == 0x2100, r == 0x2101, r == 0x2105, r == 0x2106,
		0x2488 <= r && r <= 0x249B, r == 0x33C2, r == 0x33C7, r == 0x33D8,
		r == 0xFE14, r == 0xFE19, r == 0xFE30, r == 0xFE52, r == 0xFE54, r == 0xFE68, r == 0xFE6A,
		r == 0xFF05, r == 0xFF0E, r == 0xFF0F, r == 0xFF1B, r == 0xFF3C, r == 0x1F100:
		return true
	}
	return false
}

// dotSegment reports whether seg, up to its first ';', is made only of dots
// and spaces with at least one dot.
func dotSegment(seg string) bool {
	if i := strings.IndexByte(seg, ';'); i >= 0 {
		seg = seg[:i]
	}
	dot := false
	for i := 0; i < len(seg); i++ {
		switch seg[i] {
		case '.':
			dot = true
		case ' ':
		default:
			return false
		}
	}
	return dot
}

// checkWriteRequest refuses, before anything else is looked at, fenced
// writes that could not be one request and one answer (docs/design.md guarantee
// 8) or whose lease is ambiguous; wf is r's header as the road reads it
// (writefields.go). It returns nil for the common request.
func checkWriteRequest(r *http.Request, wf *writeFields) error {
	if r.Method == http.MethodConnect {
		return &tunnelError{method: true}
	}
	if wf.upgrade || httpguts.HeaderValuesContainsToken(wf.connection, "upgrade") {
		return &tunnelError{}
	}
	if len(wf.lease) > 1 {
		return tokens.Invalid(HeaderLease, "must be sent once: more than one such header")
	}
	if k := wf.lookalike; k != "" { // lookalike.go
		return lookalikeError(k)
	}
	if strings.IndexFunc(r.URL.RawQuery, notInRequestLine) >= 0 {
		// The query goes upstream byte for byte (rewrite), into the
		// request line, which a space would split (or a control byte
		// break) into a different request. No HTTP/1.1 request line
		// carries one, but a handler may be handed a request that did
		// not come through one (an embedder's server, a test).
		return tokens.Invalid("query", "has a space or control character, which a request line cannot carry")
	}
	return nil
}

// notInRequestLine reports whether c cannot appear in a request line's
// target: a space (the line's separator) or a control character.
func notInRequestLine(c rune) bool { return c <= ' ' || c == 0x7f }

// tunnelError refuses an upgrade or CONNECT on /v1/proxy/: the check of a
// fenced write covers one exchange, and a tunnel would carry bytes past the
// lease's end, past its release and past the next grant, with the
// upstream's credentials the gateway added.
type tunnelError struct{ method bool }

func (e *tunnelError) Error() string {
	if e.method {
		return "CONNECT is not forwarded"
	}
	return "upgrades are not forwarded"
}

// Unwrap is the refusal: 405 method_not_allowed for CONNECT, 400
// invalid_request for an upgrade.
func (e *tunnelError) Unwrap() error {
	if e.method {
		return problems.ErrMethodNotAllowed
	}
	return tokens.ErrInvalid
}

func (e *tunnelError) field() string {
	if e.method {
		return "method"
	}
	return "Upgrade"
}

func (e *tunnelError) detail() string {
	const why = ": a fenced write is one request and one answer, and a tunnel would outlive the lease check; nothing was forwarded"
	if e.method {
		return "CONNECT is not forwarded" + why
	}
	return "protocol upgrades (WebSocket, h2c) are not forwarded" + why
}

// truncateUTF8 cuts s to at most n bytes without splitting a character,
// so that what is recorded and shown stays valid UTF-8.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
