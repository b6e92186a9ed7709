package resp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// ErrNotAggregate reports a reply that is no array, set or map.
var ErrNotAggregate = errors.New("not an aggregate reply")

// SplitAggregate splits an array, set or map reply into its elements (a
// map's keys and values alternate).
func SplitAggregate(reply []byte) (byte, [][]byte, error) {
	if len(reply) == 0 || (reply[0] != '*' && reply[0] != '~' && reply[0] != '%') {
		return 0, nil, ErrNotAggregate
	}
	r := bufio.NewReader(bytes.NewReader(reply))
	typ, _ := r.ReadByte()
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, nil, err
	}
	n, ok := ParseLength(line)
	if !ok || n < 0 {
		return 0, nil, fmt.Errorf("%w: %q", ErrNotAggregate, line)
	}
	if typ == '%' {
		n *= 2
	}
	elems := make([][]byte, 0, n)
	var ri ReplyInfo
	for range n {
		b, err := ReadFrame(r, &ri)
		if err != nil {
			return 0, nil, err
		}
		elems = append(elems, b)
	}
	return typ, elems, nil
}

// JoinAggregate writes an aggregate of type typ and n entries (pairs, for
// a map) made of elems.
func JoinAggregate(typ byte, n int, elems [][]byte) []byte {
	b := []byte{typ}
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, '\r', '\n')
	for _, e := range elems {
		b = append(b, e...)
	}
	return b
}
