package resp

import (
	"bufio"
	"bytes"
)

// Frames reads whole replies (frames) off a connection, each into a
// buffer it reuses from one to the next: for the readers that look at a
// reply before deciding what to do with it (a sink's invalidations, a
// mirror's keyspace messages, the proxy's own queries).
type Frames struct {
	buf  bytes.Buffer
	w    *bufio.Writer
	Info ReplyInfo // the last frame's
}

// Next reads the next frame from r. It is valid until the next call.
func (f *Frames) Next(r *bufio.Reader) ([]byte, error) {
	if f.w == nil {
		f.w = bufio.NewWriter(&f.buf)
	}
	f.buf.Reset()
	if err := CopyReply(f.w, r, &f.Info); err != nil {
		return nil, err
	}
	f.w.Flush()
	return f.buf.Bytes(), nil
}

// ReadFrame reads one frame from r, into a slice of its own, and what
// ri says of it.
func ReadFrame(r *bufio.Reader, ri *ReplyInfo) ([]byte, error) {
	var f Frames
	b, err := f.Next(r)
	*ri = f.Info
	return b, err
}
