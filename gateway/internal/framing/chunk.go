package framing

// The chunked body after a Transfer-Encoding head, followed as Go's
// server will read it (net/http/internal's chunkedReader and the trailer
// check in transfer.go), so that a malformed body already read with its
// head is refused before the request is forwarded: the upstream then never
// sees a request that breaks off, and the resource does not drain for it.
//
// The scanner only ever refuses what Go's reader refuses too (one rule
// short of it is fine: Go refuses the body later, mid-forward, as before);
// it never refuses what Go's reader takes. The rules followed:
//   - a chunk-size line ends with CRLF and holds no other CR (a bare LF
//     ends nothing: RFC 9112 7.1, erratum 7633);
//   - its size is 1 to 16 hex digits, right at the line's start; after them
//     only whitespace, or ';' and an extension (whose syntax Go ignores);
//   - the line, CRLF included, fits Go's 4 KiB read buffer;
//   - each chunk's data is followed by exactly CRLF.
//
// Not followed (the verdict stays open, Go judges): trailer fields after
// the last chunk, and Go's bound on the bytes of chunk-size lines and
// extensions against the data they carry.

// chunkScan is what the scanner saw of a chunked body.
type chunkScan struct {
	left   uint64 // data bytes of the current chunk still to come
	digits int    // hex digits of the current size line
	line   int    // bytes of the current size line
	last   bool   // the current size line is the last chunk's (size 0)
	bad    string // why Go's reader will refuse the body, "" if it may not
	done   bool   // the body ended, well-formed, without trailer fields
}

// maxChunkLine is the longest chunk-size line, CRLF included, that Go's
// server reads (its bufio.Reader's size; readChunkLine gives up on a longer
// one).
const maxChunkLine = 4096

// chunkBytes follows p, the next bytes of a chunked body, and returns how
// many it took (all of p unless the body ended or the scanner stopped).
func (s *scanner) chunkBytes(p []byte) int {
	c := &s.chunk
	for i := 0; i < len(p); {
		if s.state == scanChunkData {
			n := uint64(len(p) - i)
			if n > c.left {
				n = c.left
			}
			c.left -= n
			i += int(n)
			if c.left == 0 {
				s.state = scanChunkDataCR
			}
			continue
		}
		b := p[i]
		i++
		switch s.state {
		case scanChunkSize, scanChunkOWS, scanChunkExt:
			if c.line++; c.line > maxChunkLine {
				s.chunkFail("a chunk-size line longer than " + "4096 bytes")
				return i
			}
			s.chunkLineByte(b)
		case scanChunkLF:
			if b != '\n' {
				s.chunkFail("a CR inside a chunk-size line")
				return i
			}
			if c.line++; c.line > maxChunkLine {
				s.chunkFail("a chunk-size line longer than " + "4096 bytes")
				return i
			}
			switch {
			case c.digits == 0:
				s.chunkFail("a chunk-size line without a size")
				return i
			case c.last:
				s.state = scanLastCRLF
			default:
				s.state = scanChunkData
			}
		case scanChunkDataCR:
			if b != '\r' {
				s.chunkFail("chunk data not followed by CRLF")
				return i
			}
			s.state = scanChunkDataLF
		case scanChunkDataLF:
			if b != '\n' {
				s.chunkFail("chunk data not followed by CRLF")
				return i
			}
			*c = chunkScan{}
			s.state = scanChunkSize
		case scanLastCRLF:
			if b != '\r' {
				// Trailer fields: Go's textproto judges them.
				s.state = scanStopped
				return i
			}
			s.state = scanLastLF
		case scanLastLF:
			if b != '\n' {
				s.state = scanStopped
				return i
			}
			c.done = true
			s.state = scanStopped
			return i
		}
		if s.state == scanStopped {
			return i
		}
	}
	return len(p)
}

// chunkLineByte follows one byte of a chunk-size line before its CR.
func (s *scanner) chunkLineByte(b byte) {
	c := &s.chunk
	switch {
	case b == '\r':
		s.state = scanChunkLF
	case b == '\n':
		s.chunkFail("a chunk-size line ends with a bare LF")
	case s.state == scanChunkExt:
		// Go ignores an extension's syntax.
	case b == ';' && c.digits > 0 && s.state == scanChunkSize:
		s.state = scanChunkExt
	case b == ' ' || b == '\t':
		if c.digits == 0 {
			s.chunkFail("whitespace before a chunk size")
			return
		}
		s.state = scanChunkOWS
	case s.state == scanChunkOWS:
		// Go trims only trailing whitespace: "5 ;x" or "5 6" is no size.
		s.chunkFail("whitespace inside a chunk size")
	default:
		d, ok := hexDigit(b)
		if !ok {
			s.chunkFail("a byte that is not a hex digit in a chunk size")
			return
		}
		if c.digits == 16 {
			s.chunkFail("a chunk size of more than 16 hex digits")
			return
		}
		c.digits++
		c.left = c.left<<4 | uint64(d)
		c.last = c.left == 0
	}
}

func hexDigit(b byte) (byte, bool) {
	switch {
	case '0' <= b && b <= '9':
		return b - '0', true
	case 'a' <= b && b <= 'f':
		return b - 'a' + 10, true
	case 'A' <= b && b <= 'F':
		return b - 'A' + 10, true
	}
	return 0, false
}

// chunkFail records why Go's reader will refuse the body and stops
// following the connection.
func (s *scanner) chunkFail(reason string) {
	s.chunk.bad = "malformed chunked encoding: " + reason
	s.state = scanStopped
}
