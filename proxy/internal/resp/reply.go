package resp

import (
	"bufio"
	"errors"
	"fmt"
)

// maxPending bounds the number of values a reply may still owe. Redis
// cannot come near it (it would have to send 2^62 values); a corrupt
// stream that declares absurd counts hits it before the count overflows.
const maxPending = 1 << 62

// ErrMidReply reports that the backend stream broke after part of a reply
// was already written to the client, so the client's stream is no longer in
// step and its connection must be closed.
var ErrMidReply = errors.New("proxy: backend reply cut short")

// ReplyInfo is what the forwarding loop needs to know about one top-level
// reply it copied: its type, and for aggregates the first element (when it
// is a short bulk string) and the third (when it is an integer). That is
// enough to recognise pub/sub messages and subscription confirmations
// without decoding anything else.
type ReplyInfo struct {
	Type    byte
	N       int64 // element count of an aggregate
	head    [16]byte
	headLen int // -1 when the first element is not a short bulk string
	Third   int64
	HasInt  bool // the third element was an integer
	line    [64]byte
	lineLen int // the start of a single-line reply (+, -, :)
}

func (ri *ReplyInfo) Head() []byte {
	if ri.headLen < 0 {
		return nil
	}
	return ri.head[:ri.headLen]
}

func (ri *ReplyInfo) Line() []byte { return ri.line[:ri.lineLen] }

// CopyReply copies exactly one RESP2/RESP3 reply from r to w, byte for
// byte, without buffering whole values: a 512 MB bulk string streams
// through the bufio buffers. An attribute (|) is copied together with the
// value it annotates, at the top level and inside aggregates. The returned
// error is ErrMidReply (wrapping the cause) when some of the reply had
// already been written.
func CopyReply(w *bufio.Writer, r *bufio.Reader, ri *ReplyInfo) error {
	typ, err := r.ReadByte()
	if err != nil {
		return err
	}
	if err := w.WriteByte(typ); err != nil {
		return fmt.Errorf("%w: %w", ErrMidReply, err)
	}
	ri.Type, ri.N, ri.headLen, ri.HasInt, ri.lineLen = typ, 0, -1, false, 0
	switch typ {
	case '+', '-', ':', '_', ',', '#', '(':
		err = copyLine(w, r, ri)
	case '$', '!', '=':
		_, err = copyValue(w, r, typ, true, -1, ri)
	default:
		err = copyNested(w, r, typ, ri)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMidReply, err)
	}
	return nil
}

// copyNested copies the rest of a reply that is an aggregate or begins with
// an attribute, typ being its first byte, already copied.
//
// Nesting costs nothing: instead of recursing into aggregates, the copy
// counts the values the reply still owes, so a reply nested a million
// levels deep (a Lua script can return one) is copied like a flat one, with
// no depth limit and no stack to exhaust. Two counters are enough because
// the only structure that matters is the top-level aggregate's first
// elements, for ReplyInfo.
func copyNested(w *bufio.Writer, r *bufio.Reader, typ byte, ri *ReplyInfo) error {
	var (
		children int64 // direct elements of the top-level aggregate still to come
		sub      int64 // values still to come below the current direct element
		attr     bool  // a top-level attribute was read: the reply itself follows
	)
	for first := true; ; first = false {
		if !first {
			var err error
			if typ, err = r.ReadByte(); err != nil {
				return err
			}
			if err := w.WriteByte(typ); err != nil {
				return err
			}
		}
		idx := int64(-1) // index among the top-level aggregate's elements
		top := false
		switch {
		case sub > 0:
			sub--
		case children > 0:
			idx = ri.N - children
			if typ != '|' { // an attribute is not an element
				children--
			}
		default:
			top = true
			ri.Type, ri.N, ri.headLen, ri.HasInt, ri.lineLen = typ, 0, -1, false, 0
		}
		n, err := copyValue(w, r, typ, top, idx, ri)
		if err != nil {
			return err
		}
		if n > maxPending-sub {
			return errors.New("reply declares too many elements")
		}
		switch {
		case top && typ != '|':
			children, ri.N, attr = n, n, false
		case top:
			attr = true
			sub += n
		case idx < 0 && typ == '|':
			sub += n + 1 // the pairs and the value they annotate
		default:
			// An attribute before a direct element is followed by the
			// value it annotates, which is read in the attribute's place.
			sub += n
		}
		if sub == 0 && children == 0 && !attr {
			return nil
		}
	}
}

// copyValue copies the rest of a value whose type byte was already copied
// and returns how many values an aggregate (or attribute) header declared.
// top says the value is the reply itself, idx is its index among the
// top-level aggregate's elements (-1 when it is not one of them); both
// decide what is recorded in ri.
func copyValue(w *bufio.Writer, r *bufio.Reader, typ byte, top bool, idx int64, ri *ReplyInfo) (int64, error) {
	switch typ {
	case '+', '-', ':', '_', ',', '#', '(':
		if typ == ':' && idx == 2 {
			v, ok, err := peekInt(r)
			if err != nil {
				return 0, err
			}
			ri.Third, ri.HasInt = v, ok
		}
		if top {
			return 0, copyLine(w, r, ri)
		}
		return 0, copyLine(w, r, nil)
	case '$', '!', '=':
		if typ == '$' && idx == 0 {
			if err := peekHead(r, ri); err != nil {
				return 0, err
			}
		}
		n, err := copyLength(w, r)
		if err != nil || n < 0 { // $-1: the RESP2 null bulk string
			return 0, err
		}
		return 0, copyN(w, r, n+2)
	case '*', '~', '>', '%', '|':
		n, err := copyLength(w, r)
		if err != nil || n < 0 { // *-1: the RESP2 null array
			return 0, err
		}
		if typ == '%' || typ == '|' {
			n *= 2
		}
		return n, nil
	default:
		return 0, fmt.Errorf("unexpected reply type %q", typ)
	}
}

// copyLine copies up to and including the next "\r\n".
func copyLine(w *bufio.Writer, r *bufio.Reader, ri *ReplyInfo) error {
	first := true
	for {
		b, err := r.ReadSlice('\n')
		if first && ri != nil {
			ri.lineLen = copy(ri.line[:], b)
			first = false
		}
		if _, werr := w.Write(b); werr != nil {
			return werr
		}
		if err == nil {
			return nil
		}
		if err != bufio.ErrBufferFull {
			return err
		}
	}
}

// copyLength copies a length line ("3\r\n") and returns the number. Only -1
// is accepted as a negative length, as in RESP's null values.
func copyLength(w *bufio.Writer, r *bufio.Reader) (int64, error) {
	b, err := r.ReadSlice('\n')
	if err != nil {
		if err == bufio.ErrBufferFull {
			err = errors.New("length line too long")
		}
		return 0, err
	}
	n, ok := ParseLength(b)
	if !ok {
		return 0, fmt.Errorf("invalid length %q", b)
	}
	if _, err := w.Write(b); err != nil {
		return 0, err
	}
	return n, nil
}

// ParseLength parses "123\r\n" or "-1\r\n".
func ParseLength(b []byte) (int64, bool) {
	if len(b) < 3 || b[len(b)-2] != '\r' {
		return 0, false
	}
	b = b[:len(b)-2]
	if len(b) == 2 && b[0] == '-' && b[1] == '1' {
		return -1, true
	}
	return parseUint(b)
}

// IntegerReply returns the value of a whole integer reply (":n\r\n", n
// not negative, as ParseLength reads it).
func IntegerReply(b []byte) (int64, bool) {
	if len(b) < 4 || b[0] != ':' {
		return 0, false
	}
	return ParseLength(b[1:])
}

// parseUint parses a non-negative decimal of at most 18 digits.
func parseUint(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// copyN copies n bytes from r to w through the bufio buffers.
func copyN(w *bufio.Writer, r *bufio.Reader, n int64) error {
	for n > 0 {
		if r.Buffered() == 0 {
			if _, err := r.Peek(1); err != nil {
				return err
			}
		}
		k := r.Buffered()
		if int64(k) > n {
			k = int(n)
		}
		b, _ := r.Peek(k)
		if _, err := w.Write(b); err != nil {
			return err
		}
		r.Discard(k)
		n -= int64(k)
	}
	return nil
}

// peekHead records a short bulk string that starts at r (its "$" already
// read) without consuming it.
func peekHead(r *bufio.Reader, ri *ReplyInfo) error {
	b, err := r.Peek(4)
	if err != nil {
		return err
	}
	n := 0
	i := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		n = n*10 + int(b[i]-'0')
	}
	if i == 0 || i > 2 || n > len(ri.head) {
		return nil
	}
	full, err := r.Peek(i + 2 + n)
	if err != nil {
		return err
	}
	ri.headLen = copy(ri.head[:], full[i+2:])
	return nil
}

// peekInt reads the integer at r (its ":" already read) without consuming
// it. It peeks one byte more at a time and stops at the line's end, so it
// never waits for bytes beyond the integer's own line.
func peekInt(r *bufio.Reader) (int64, bool, error) {
	for i := 1; i <= 22; i++ {
		b, err := r.Peek(i)
		if err != nil {
			return 0, false, err
		}
		if b[i-1] == '\n' {
			v, ok := ParseLength(b)
			return v, ok, nil
		}
	}
	return 0, false, nil
}
