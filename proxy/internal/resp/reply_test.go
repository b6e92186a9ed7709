package resp

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

// TestCopyReplyAnyDepth copies replies nested 100000 levels deep, of
// every aggregate type and with attributes inside, and requires each to be
// copied whole and exactly, ending where the next reply begins.
func TestCopyReplyAnyDepth(t *testing.T) {
	const depth = 100_000
	tests := []struct {
		name string
		open string // one level's header, repeated depth times
		leaf string
		tail string // what each level owes after the nested value, repeated depth times
	}{
		{"arrays", "*1\r\n", ":1\r\n", ""},
		{"arrays with a sibling after the nested element", "*2\r\n", ":1\r\n", ":2\r\n"},
		{"maps", "%1\r\n+k\r\n", "_\r\n", ""},
		{"maps with the nesting in the key", "%1\r\n", "_\r\n", "+v\r\n"},
		{"sets", "~1\r\n", "#t\r\n", ""},
		{"pushes", ">1\r\n", "$3\r\nabc\r\n", ""},
		{"attributes before each element", "*1\r\n|1\r\n+a\r\n:1\r\n", ",1.5\r\n", ""},
		// An attribute's value is itself annotated, down to the leaf; then
		// every attribute's annotated value follows.
		{"attributes of attributes", "|1\r\n+k\r\n", "+v\r\n", "+annotated\r\n"},
		{"null arrays inside", "*2\r\n*-1\r\n", "$-1\r\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			b.WriteString(strings.Repeat(tt.open, depth))
			b.WriteString(tt.leaf)
			b.WriteString(strings.Repeat(tt.tail, depth))
			reply := b.String()
			next := "+NEXT\r\n"
			r := bufio.NewReaderSize(strings.NewReader(reply+next), 16)
			var out bytes.Buffer
			w := bufio.NewWriterSize(&out, 16)
			var ri ReplyInfo
			if err := CopyReply(w, r, &ri); err != nil {
				t.Fatal(err)
			}
			w.Flush()
			if out.String() != reply {
				t.Fatalf("copied %d bytes, want the %d of the reply", out.Len(), len(reply))
			}
			out.Reset()
			if err := CopyReply(w, r, &ri); err != nil || w.Flush() != nil || out.String() != next {
				t.Fatalf("the next reply: %q, %v", out.String(), err)
			}
		})
	}
}

// TestCopyReplyInfo checks what the forwarding loop learns about a reply:
// the top-level type and count, the first element when it is a short bulk
// string and the third when it is an integer, also when attributes come
// before the reply or its elements.
func TestCopyReplyInfo(t *testing.T) {
	tests := []struct {
		name     string
		give     string
		typ      byte
		n        int64
		head     string
		third    int64
		hasThird bool
		line     string
	}{
		{"status", "+OK\r\n", '+', 0, "", 0, false, "OK\r\n"},
		{"subscribe confirmation", "*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n", '*', 3, "subscribe", 1, true, ""},
		{"push message", ">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nm\r\n", '>', 3, "message", 0, false, ""},
		{"attribute before the reply", "|1\r\n$1\r\nk\r\n*1\r\n:9\r\n>3\r\n$7\r\nmessage\r\n$1\r\nc\r\n:7\r\n", '>', 3, "message", 7, true, ""},
		{"attribute before elements", "*3\r\n|1\r\n+a\r\n+b\r\n$4\r\nlong\r\n:5\r\n|1\r\n+a\r\n:8\r\n:6\r\n", '*', 3, "long", 6, true, ""},
		{"nested first element", "*3\r\n*1\r\n$1\r\nx\r\n$1\r\ny\r\n:1\r\n", '*', 3, "", 1, true, ""},
		{"map counts keys and values", "%2\r\n$1\r\na\r\n:1\r\n:2\r\n:3\r\n", '%', 4, "a", 2, true, ""},
		{"attribute before a status", "|1\r\n+a\r\n+b\r\n-ERR x\r\n", '-', 0, "", 0, false, "ERR x\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := bufio.NewReader(strings.NewReader(tt.give))
			var out bytes.Buffer
			w := bufio.NewWriter(&out)
			var ri ReplyInfo
			if err := CopyReply(w, r, &ri); err != nil {
				t.Fatal(err)
			}
			w.Flush()
			if out.String() != tt.give || r.Buffered() != 0 {
				t.Fatalf("copied %q of %q", out.String(), tt.give)
			}
			if ri.Type != tt.typ || ri.N != tt.n || string(ri.Head()) != tt.head ||
				ri.HasInt != tt.hasThird || ri.Third != tt.third || string(ri.Line()) != tt.line {
				t.Fatalf("got typ %q n %d head %q third %d/%v line %q", ri.Type, ri.N, ri.Head(),
					ri.Third, ri.HasInt, ri.Line())
			}
		})
	}
}

// BenchmarkCopyReply copies typical replies from a buffered stream: the
// reader's cost per reply without the network.
func BenchmarkCopyReply(b *testing.B) {
	for _, tc := range []struct{ name, reply string }{
		{"status", "+OK\r\n"},
		{"bulk", "$3\r\nxxx\r\n"},
		{"array of 10", "*10\r\n" + strings.Repeat("$5\r\nvalue\r\n", 10)},
		{"pubsub message", "*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			stream := []byte(strings.Repeat(tc.reply, 1000))
			src := bytes.NewReader(stream)
			r := bufio.NewReaderSize(src, 64<<10)
			w := bufio.NewWriterSize(discardWriter{}, 64<<10)
			var ri ReplyInfo
			b.SetBytes(int64(len(tc.reply)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if i%1000 == 0 {
					src.Reset(stream)
					r.Reset(src)
				}
				if err := CopyReply(w, r, &ri); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }

func TestIntegerReply(t *testing.T) {
	for _, tt := range []struct {
		give string
		n    int64
		ok   bool
	}{
		{":0\r\n", 0, true},
		{":42\r\n", 42, true},
		{"+OK\r\n", 0, false},
		{":x\r\n", 0, false},
		{":\r\n", 0, false},
		{"-ERR no\r\n", 0, false},
	} {
		if n, ok := IntegerReply([]byte(tt.give)); n != tt.n || ok != tt.ok {
			t.Errorf("IntegerReply(%q) = %d, %v, want %d, %v", tt.give, n, ok, tt.n, tt.ok)
		}
	}
}
