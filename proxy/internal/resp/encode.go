package resp

import "github.com/tidwall/redcon"

// Encode encodes args as a RESP request (an array of bulk strings).
func Encode(args [][]byte) []byte {
	n := 16
	for _, a := range args {
		n += len(a) + 16
	}
	b := redcon.AppendArray(make([]byte, 0, n), len(args))
	for _, a := range args {
		b = redcon.AppendBulk(b, a)
	}
	return b
}

// Command encodes args as a RESP request, as Encode does.
func Command(args ...string) []byte {
	b := redcon.AppendArray(nil, len(args))
	for _, a := range args {
		b = redcon.AppendBulkString(b, a)
	}
	return b
}
