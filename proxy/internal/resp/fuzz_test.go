package resp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"

	"github.com/tidwall/redcon"
)

// scannedReader feeds r through a Scanner the way clientConn does.
type scannedReader struct {
	r   io.Reader
	sc  Scanner
	err error
}

func (s *scannedReader) Read(b []byte) (int, error) {
	if s.sc.Pending() {
		return s.sc.Drain(b), nil
	}
	if s.err != nil {
		return 0, s.err
	}
	for {
		n, err := s.r.Read(b)
		if n > 0 {
			k, verr := s.sc.Scan(b[:n])
			if k == 0 && s.sc.Pending() {
				k = s.sc.Drain(b)
			}
			if verr != nil {
				s.err = verr
				if k == 0 {
					return 0, verr
				}
				return k, nil
			}
			if k > 0 || err != nil {
				return k, err
			}
			continue
		}
		return n, err
	}
}

// chunked returns data in reads of at most n bytes.
type chunked struct {
	data []byte
	n    int
}

func (c *chunked) Read(b []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	k := min(len(b), c.n, len(c.data))
	copy(b, c.data[:k])
	c.data = c.data[k:]
	return k, nil
}

// FuzzRequestPath sends any bytes, in reads of any size, through the
// request scanner and redcon's parser, as a client connection does.
// Nothing may panic, no accepted command may exceed a limit, redcon may
// never find a protocol error of its own (the scanner hands it only
// requests it reads as Redis does), and how the bytes are cut into reads
// changes nothing: the commands and the error are those of the whole
// input read at once.
func FuzzRequestPath(f *testing.F) {
	for _, s := range []string{
		"*1\r\n$4\r\nPING\r\n", "PING\r\n", "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "*-1\r\n", "*0\r\n",
		"*1\r\n$-1\r\n", "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$9999999999\r\n", "\"unbalanced\r\n",
		"*2\r\n$4\r\nLOCK\r\n:1\r\n", "SET a 'b c'\r\n", "*1\r\n$4\r\nPI", "*1\rx$4\rxPINGxx",
		"ECHO \"\\x41\" 'b\\'' c\"d e\"\r\n", "*-5\r\n\r\n \r\nPI\x00NG\r\n",
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		cmds, err := readRequests(t, data, int(chunk%64)+1)
		whole, wholeErr := readRequests(t, data, len(data)+1)
		if !slices.Equal(cmds, whole) || !errors.Is(err, wholeErr) && fmt.Sprint(err) != fmt.Sprint(wholeErr) {
			t.Fatalf("in reads of %d bytes: %q, %v; at once: %q, %v", chunk%64+1, cmds, err, whole, wholeErr)
		}
	})
}

// readRequests reads data as a client connection does, in reads of at
// most chunk bytes, and returns the commands (arguments joined by spaces)
// and the error that ended them.
func readRequests(t *testing.T, data []byte, chunk int) ([]string, error) {
	sr := &scannedReader{
		r:  &chunked{data: data, n: chunk},
		sc: Scanner{MaxBulk: 64, MaxMultibulk: 8, MaxInline: 128},
	}
	rd := redcon.NewReader(sr)
	var out []string
	for range 10000 {
		cmds, err := rd.ReadCommands()
		for _, c := range cmds {
			if len(c.Args) > 8 {
				t.Fatalf("a command of %d arguments passed the limit of 8", len(c.Args))
			}
			for _, a := range c.Args {
				if len(a) > 128 { // the larger of the bulk and inline limits
					t.Fatalf("an argument of %d bytes passed the limits", len(a))
				}
			}
			out = append(out, string(bytes.Join(c.Args, []byte(" "))))
		}
		if err != nil {
			var pe *ProtocolError
			if err != io.EOF && !errors.As(err, &pe) {
				t.Fatalf("redcon's own error %v on a stream the scanner passed", err)
			}
			return out, err
		}
	}
	t.Fatal("no end after 10000 reads")
	return nil, nil
}

// FuzzReplyReader copies any bytes as backend replies. Nothing may panic,
// and a reply that is copied whole must be copied exactly.
func FuzzReplyReader(f *testing.F) {
	for _, s := range []string{
		"+OK\r\n", "-ERR x\r\n", ":1\r\n", "$3\r\nabc\r\n", "$-1\r\n", "*-1\r\n", "*2\r\n$1\r\na\r\n:2\r\n",
		"%1\r\n+a\r\n:1\r\n", ">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n", "_\r\n", ",1.5\r\n", "#t\r\n",
		"|1\r\n+k\r\n+v\r\n+OK\r\n", "=7\r\ntxt:abc\r\n", "(123\r\n", "~1\r\n:1\r\n", "*99999999999\r\n",
		"$99999999999999999999\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(data), 16)
		var out bytes.Buffer
		w := bufio.NewWriterSize(&out, 16)
		var ri ReplyInfo
		consumed := 0
		for {
			if err := CopyReply(w, r, &ri); err != nil {
				return
			}
			w.Flush()
			consumed = out.Len()
			if !bytes.Equal(out.Bytes(), data[:consumed]) {
				t.Fatalf("copied %q, input began %q", out.Bytes(), data[:consumed])
			}
		}
	})
}
