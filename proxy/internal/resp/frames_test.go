package resp

import (
	"bufio"
	"strings"
	"testing"
)

// TestFrames: Next reads one whole reply at a time, nested and RESP3 ones
// included, and ReadFrame one into a slice of its own with its type.
func TestFrames(t *testing.T) {
	in := "+OK\r\n*2\r\n$3\r\nfoo\r\n%1\r\n:1\r\n_\r\n>2\r\n$10\r\ninvalidate\r\n_\r\n"
	r := bufio.NewReader(strings.NewReader(in))
	var f Frames
	for _, want := range []string{"+OK\r\n", "*2\r\n$3\r\nfoo\r\n%1\r\n:1\r\n_\r\n"} {
		got, err := f.Next(r)
		if err != nil || string(got) != want {
			t.Fatalf("Next: %q, %v; want %q", got, err, want)
		}
	}
	var ri ReplyInfo
	got, err := ReadFrame(r, &ri)
	if err != nil || string(got) != ">2\r\n$10\r\ninvalidate\r\n_\r\n" || ri.Type != '>' {
		t.Fatalf("ReadFrame: %q (type %q), %v", got, ri.Type, err)
	}
	if _, err := f.Next(r); err == nil {
		t.Fatal("Next at the end of the stream: no error")
	}
}
