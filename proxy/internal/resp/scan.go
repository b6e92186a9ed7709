package resp

import (
	"strconv"
)

// ProtocolError is a request that breaks the RESP protocol or one of the
// configured request limits. The client gets "-ERR Protocol error: <Msg>"
// and its connection is closed, as Redis does.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "Protocol error: " + e.Msg }

// Redis's own wording for each violation.
var (
	errMultibulkLen = &ProtocolError{"invalid multibulk length"}
	errBulkLen      = &ProtocolError{"invalid bulk length"}
	errInlineLen    = &ProtocolError{"too big inline request"}
	errCountLen     = &ProtocolError{"too big mbulk count string"}
	errBulkCountLen = &ProtocolError{"too big bulk count string"}
	errUnbalanced   = &ProtocolError{"unbalanced quotes in request"}
)

// MaxCount is the largest argument count Redis 7.0 accepts (INT_MAX).
const MaxCount = 1<<31 - 1

// scanner states.
const (
	sTop         = iota // at the start of a request
	sInline             // in an inline request's line
	sCount              // in a multibulk request's "*<count>" line
	sBulkLine           // in an argument's "$<length>" line
	sCountEnd           // after the '\r' of a count line
	sBulkLineEnd        // after the '\r' of a length line
	sBulkData           // in an argument's bytes
	sBulkEnd            // in the two bytes after an argument
)

// Scanner follows the framing of the client's request stream and
// decides, as Redis's request parser does (processInlineBuffer and
// processMultibulkBuffer in networking.c), what each request is: a
// command, nothing (an empty line, a count of zero or less), or a protocol
// error, with Redis's reply. It checks every declared length against the
// limits before anything waits for it: a client that declares a 500 MB
// argument and sends three bytes has cost three bytes.
//
// It also rewrites the stream, in place, into plain multibulk requests
// that redcon's parser reads exactly as Redis reads the original: requests
// Redis skips are removed, inline requests are split by Redis's rules
// (quotes, escapes, any blank) and re-encoded, and the bytes Redis does not
// look at (the one after a line's '\r', the two after an argument) are set
// to "\r\n". So redcon never sees a request it would judge differently
// from Redis, and never has a protocol error of its own.
//
// A line ends at its first '\r' (multibulk) or '\n' (inline) and Redis
// looks for it with strchr, so a NUL byte before it hides the end: the
// line then grows until it breaks the line limit, as in Redis. Redis
// checks that limit only while a line's end has not arrived, so there a
// line somewhat longer than the limit passes when its end comes in the
// same read that crosses the limit; here the limit holds for every line.
type Scanner struct {
	MaxBulk      int64
	MaxMultibulk int64
	MaxInline    int64

	state   uint8
	stuck   bool  // a NUL hid the end of the current line
	line    int64 // bytes of the current line so far, with its '*' or '$'
	first   byte  // the first byte of a bulk length line
	num     lineNumber
	args    int64  // arguments left in the current multibulk request
	skip    int64  // bytes left of the current argument
	inline  []byte // the current inline line
	encoded []byte // an inline request's arguments, encoded
	token   []byte // scratch for one inline argument
	// pend holds output that did not fit where its input was; it is
	// delivered before any byte read after it. spillBuf keeps its buffer
	// for the next time.
	pend     []byte
	spillBuf []byte
}

// lineNumber parses a count or length as Redis's string2ll does, a byte
// at a time: an optional '-', then digits without leading zeros ("0"
// alone is zero), at most 20 bytes, within int64.
type lineNumber struct {
	v      uint64
	n      int  // bytes seen
	digits int  // digits seen
	neg    bool // the first byte was '-'
	bad    bool
}

func (ln *lineNumber) add(c byte) {
	ln.n++
	switch {
	case ln.bad:
	case c == '-' && ln.n == 1:
		ln.neg = true
	case c < '0' || c > '9':
		ln.bad = true
	case ln.digits > 0 && ln.v == 0: // a leading zero
		ln.bad = true
	case ln.v > (1<<64-1)/10 || ln.v*10 > 1<<64-1-uint64(c-'0'):
		ln.bad = true
	default:
		ln.digits++
		ln.v = ln.v*10 + uint64(c-'0')
	}
}

// value returns the number and whether it is one.
func (ln *lineNumber) value() (int64, bool) {
	if ln.bad || ln.digits == 0 || ln.n >= 21 || (ln.neg && ln.v == 0) {
		return 0, false
	}
	if ln.neg {
		if ln.v > 1<<63 {
			return 0, false
		}
		return -int64(ln.v-1) - 1, true
	}
	if ln.v > 1<<63-1 {
		return 0, false
	}
	return int64(ln.v), true
}

// out writes the scanner's output into the client's buffer behind the
// input it has consumed, or into pend when it does not fit there.
type out struct {
	b []byte
	w int // output bytes in b
}

// put writes p as output; i is the end of the input consumed so far, so
// b[w:i] is free.
func (o *out) put(sc *Scanner, p []byte, i int) {
	if len(sc.pend) == 0 && len(p) <= i-o.w {
		o.w += copy(o.b[o.w:], p)
		return
	}
	sc.spill(p)
}

// spill adds p to the pending output.
func (sc *Scanner) spill(p []byte) {
	if len(sc.pend) == 0 {
		sc.pend = sc.spillBuf[:0]
	}
	sc.pend = append(sc.pend, p...)
	if cap(sc.pend) <= 4096 { // a larger one is not kept: clients are many
		sc.spillBuf = sc.pend[:0]
	}
}

// Scan reads b, the next bytes of the stream, and rewrites it in place. It
// returns how many bytes at the start of b are output, which come before
// sc.pend, and, if the stream broke a rule, the error, which comes after
// both (the output then ends with the requests before the faulty one,
// and perhaps the start of that one, which is never completed).
func (sc *Scanner) Scan(b []byte) (int, error) {
	o := out{b: b}
	var hdr [24]byte
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch sc.state {
		case sTop:
			if c == '*' && len(sc.pend) == 0 {
				// The common request, whole in b and plain, passes as is.
				if n := sc.plain(b[i:]); n > 0 {
					if o.w != i {
						copy(b[o.w:], b[i:i+n])
					}
					o.w += n
					i += n - 1
					continue
				}
			}
			sc.line, sc.stuck = 1, c == 0
			if c == '*' {
				sc.state, sc.num = sCount, lineNumber{}
				continue
			}
			sc.state, sc.inline = sInline, sc.inline[:0]
			if c == '\n' {
				sc.endInline(&o, i+1) // an empty line: nothing
				continue
			}
			sc.inline = append(sc.inline, c)
		case sInline:
			if c == '\n' && !sc.stuck {
				if err := sc.endInline(&o, i+1); err != nil {
					return o.w, err
				}
				continue
			}
			sc.stuck = sc.stuck || c == 0
			sc.line++
			if sc.line > sc.MaxInline {
				return o.w, errInlineLen
			}
			if !sc.stuck {
				sc.inline = append(sc.inline, c)
			}
		case sCount, sBulkLine:
			if sc.state == sBulkLine && sc.line == 0 {
				sc.first = c
			}
			sc.line++
			if c == '\r' && !sc.stuck {
				if sc.state == sCount {
					sc.state = sCountEnd
				} else {
					sc.state = sBulkLineEnd
				}
				continue
			}
			sc.stuck = sc.stuck || c == 0
			if sc.line > sc.MaxInline {
				if sc.state == sCount {
					return o.w, errCountLen
				}
				return o.w, errBulkCountLen
			}
			if sc.state == sCount || sc.line > 1 {
				sc.num.add(c)
			}
		case sCountEnd:
			// Redis takes any byte after the '\r' as the line's end.
			n, ok := sc.num.value()
			if !ok || n > MaxCount || n > sc.MaxMultibulk {
				return o.w, errMultibulkLen
			}
			if n <= 0 {
				sc.state = sTop // Redis skips the request
				continue
			}
			h := append(strconv.AppendInt(append(hdr[:0], '*'), n, 10), '\r', '\n')
			o.put(sc, h, i+1)
			sc.state, sc.args = sBulkLine, n
			sc.line, sc.num, sc.stuck = 0, lineNumber{}, false
		case sBulkLineEnd:
			if sc.first != '$' {
				got := sc.first
				if got == '\r' || got == '\n' {
					got = ' ' // Redis keeps line breaks out of error replies
				}
				return o.w, &ProtocolError{"expected '$', got '" + string([]byte{got}) + "'"}
			}
			n, ok := sc.num.value()
			if !ok || n < 0 || n > sc.MaxBulk {
				return o.w, errBulkLen
			}
			h := append(strconv.AppendInt(append(hdr[:0], '$'), n, 10), '\r', '\n')
			o.put(sc, h, i+1)
			sc.state, sc.skip = sBulkData, n
			if n == 0 {
				sc.state, sc.skip = sBulkEnd, 2
			}
		case sBulkData:
			n := min(int64(len(b)-i), sc.skip)
			if len(sc.pend) == 0 {
				if o.w != i {
					copy(b[o.w:], b[i:i+int(n)])
				}
				o.w += int(n)
			} else {
				sc.spill(b[i : i+int(n)])
			}
			sc.skip -= n
			i += int(n) - 1
			if sc.skip == 0 {
				sc.state, sc.skip = sBulkEnd, 2
			}
		case sBulkEnd:
			// Redis does not look at these two bytes.
			sc.skip--
			if sc.skip > 0 {
				continue
			}
			o.put(sc, []byte("\r\n"), i+1)
			sc.args--
			sc.state = sTop
			if sc.args > 0 {
				sc.state, sc.line, sc.num, sc.stuck = sBulkLine, 0, lineNumber{}, false
			}
		}
	}
	return o.w, nil
}

// plain returns the length of the multibulk request at the start of b
// when all of it is in b and already in the form scan writes (every line
// ending in "\r\n", numbers without sign or leading zero, within the
// limits), and 0 otherwise. Such a request is what clients send, and it
// needs no state and no rewriting.
func (sc *Scanner) plain(b []byte) int {
	n, i := sc.plainNumber(b, 1)
	if n <= 0 || n > sc.MaxMultibulk || n > MaxCount {
		return 0
	}
	for ; n > 0; n-- {
		if i >= len(b) || b[i] != '$' {
			return 0
		}
		size, j := sc.plainNumber(b, i+1)
		if size < 0 || size > sc.MaxBulk || size > int64(len(b)-j-2) {
			return 0
		}
		i = j + int(size) + 2
		if b[i-2] != '\r' || b[i-1] != '\n' {
			return 0
		}
	}
	return i
}

// plainNumber parses the digits of a count or length line starting at
// b[i] and ending in "\r\n" within b, and returns the number and where
// the next line starts; the number is -1 when the line is not plain.
func (sc *Scanner) plainNumber(b []byte, i int) (int64, int) {
	start := i
	var v int64
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		v = v*10 + int64(b[i]-'0')
	}
	digits := i - start
	if digits == 0 || digits > 18 || (digits > 1 && b[start] == '0') ||
		int64(digits+1) >= sc.MaxInline || i+1 >= len(b) || b[i] != '\r' || b[i+1] != '\n' {
		return -1, 0
	}
	return v, i + 2
}

// Pending reports whether output waits to be delivered by Drain before
// anything read after it.
func (sc *Scanner) Pending() bool { return len(sc.pend) > 0 }

// Drain moves pending output into b.
func (sc *Scanner) Drain(b []byte) int {
	n := copy(b, sc.pend)
	sc.pend = sc.pend[n:]
	return n
}

// AppendPending appends the pending output to dst and returns it: what
// Drain would deliver, all at once.
func (sc *Scanner) AppendPending(dst []byte) []byte {
	dst = append(dst, sc.pend...)
	sc.pend = sc.pend[len(sc.pend):]
	return dst
}

// endInline ends an inline request at its '\n' (i is the end of the
// consumed input): it splits the line as Redis does and writes the
// arguments as a multibulk request.
func (sc *Scanner) endInline(o *out, i int) error {
	sc.state = sTop
	line := sc.inline
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	var argc int
	var ok bool
	sc.encoded, sc.token, argc, ok = splitInline(sc.encoded[:0], sc.token[:0], line)
	defer func() {
		// The buffers of a long line are not kept for the next.
		if cap(sc.inline) > 4096 || cap(sc.encoded) > 4096 || cap(sc.token) > 4096 {
			sc.inline, sc.encoded, sc.token = nil, nil, nil
		}
	}()
	switch {
	case !ok:
		return errUnbalanced
	case argc == 0:
		return nil // Redis skips a line of blanks
	case int64(argc) > sc.MaxMultibulk:
		return errMultibulkLen
	}
	var hdr [24]byte
	o.put(sc, append(strconv.AppendInt(append(hdr[:0], '*'), int64(argc), 10), '\r', '\n'), i)
	o.put(sc, sc.encoded, i)
	return nil
}

// splitInline splits an inline request line into arguments by the rules
// of Redis's sdssplitargs and appends each to dst as a RESP bulk string;
// tok is scratch for one argument. Blanks separate arguments; "double
// quotes" take \n \r \t \b \a \xHH and \<any byte> escapes, 'single
// quotes' only \'; quotes may start inside an argument; a closing quote
// must be followed by a blank or the end. ok is false for unbalanced
// quotes.
func splitInline(dst, tok, line []byte) (_, _ []byte, argc int, ok bool) {
	isBlank := func(c byte) bool { // C's isspace
		return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
	}
	i := 0
	for {
		for i < len(line) && isBlank(line[i]) {
			i++
		}
		if i == len(line) {
			return dst, tok, argc, true
		}
		tok = tok[:0]
		inDouble, inSingle := false, false
	token:
		for {
			switch {
			case inDouble:
				switch {
				case i == len(line):
					return dst, tok, 0, false
				case line[i] == '\\' && i+3 < len(line) && line[i+1] == 'x' && isHex(line[i+2]) && isHex(line[i+3]):
					tok = append(tok, unhex(line[i+2])<<4|unhex(line[i+3]))
					i += 4
				case line[i] == '\\' && i+1 < len(line):
					tok = append(tok, unescape(line[i+1]))
					i += 2
				case line[i] == '"':
					if i+1 < len(line) && !isBlank(line[i+1]) {
						return dst, tok, 0, false
					}
					i++
					break token
				default:
					tok = append(tok, line[i])
					i++
				}
			case inSingle:
				switch {
				case i == len(line):
					return dst, tok, 0, false
				case line[i] == '\\' && i+1 < len(line) && line[i+1] == '\'':
					tok = append(tok, '\'')
					i += 2
				case line[i] == '\'':
					if i+1 < len(line) && !isBlank(line[i+1]) {
						return dst, tok, 0, false
					}
					i++
					break token
				default:
					tok = append(tok, line[i])
					i++
				}
			case i == len(line):
				break token
			default:
				switch c := line[i]; c {
				case ' ', '\n', '\r', '\t': // not \v or \f, unlike between arguments
					i++
					break token
				case '"':
					inDouble = true
				case '\'':
					inSingle = true
				default:
					tok = append(tok, c)
				}
				i++
			}
		}
		dst = append(strconv.AppendInt(append(dst, '$'), int64(len(tok)), 10), '\r', '\n')
		dst = append(append(dst, tok...), '\r', '\n')
		argc++
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

func unescape(c byte) byte {
	switch c {
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	case 'b':
		return '\b'
	case 'a':
		return '\a'
	}
	return c
}
