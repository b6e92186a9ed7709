package fenced

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
	"github.com/lockproxy/lockproxy/proxy/internal/sentinel"
)

// Conn is a backend connection of the proxy's own that runs a client's
// FENCED transactions, in the client's state (which is the caller's to
// keep: see Env.Conn). Only one goroutine uses it at a time.
type Conn struct {
	be *backend.Conn
	// watched is the WATCH in effect after the last FENCED, whose GET
	// read prefetch (nil: no record), or nil; watching: a WATCH may be in
	// effect.
	watched, prefetch []byte
	watching          bool
	// The replies read last (readReplies), reused.
	buf     bytes.Buffer
	w       *bufio.Writer
	ends    []int
	replies [][]byte
}

// NewConn returns a Conn on be, which it owns from then on.
func NewConn(be *backend.Conn) *Conn { return &Conn{be: be} }

// Close closes the connection.
func (c *Conn) Close() { c.be.NC.Close() }

// Env is what Exec and Probe need of the session that runs a FENCED.
type Env struct {
	// Router is the cluster's, nil in front of one Redis.
	Router *cluster.Router
	// Follow is the Sentinel follower, told of a primary that turned
	// replica; nil without Sentinel.
	Follow *sentinel.Follower
	// Conn returns the session's connection to addr ("" for one Redis),
	// in the client's current state, and whether it was used before.
	Conn func(ctx context.Context, addr string) (c *Conn, reused bool, err error)
	// Drop closes and forgets the session's connection to addr.
	Drop func(addr string)
	// Unavailable counts a FENCED the backend could not be reached for,
	// and returns its error reply.
	Unavailable func(err error) []byte
	// Retry bounds how long a FENCED follows a changing cluster, or waits
	// for a new primary.
	Retry time.Duration
}

// Commands of the transaction.
var (
	cmdExec    = []byte("*1\r\n$4\r\nEXEC\r\n")
	cmdUnwatch = []byte("*1\r\n$7\r\nUNWATCH\r\n")
	cmdAsking  = []byte("*1\r\n$6\r\nASKING\r\n")
	replyNull2 = []byte("*-1\r\n")
	replyNull3 = []byte("_\r\n")
)

// fenceResult is what one attempt of a FENCED transaction came to.
type fenceResult int

const (
	fenceDone     fenceResult = iota // reply is the client's
	fenceStale                       // record is above the fence
	fenceAgain                       // EXEC found the record changed: try again
	fenceRedirect                    // the cluster sent it elsewhere (redirect)
	fenceLost                        // the connection failed before anything of it ran
)

// Exec runs the plan's transaction until it is done, refused, or out of
// tries or time (env.Retry), within ctx.
func Exec(ctx context.Context, env *Env, pl *Plan) ([]byte, Outcome) {
	deadline := time.Now().Add(env.Retry)
	addr, asking := "", false
	var gen uint64
	lost := false
	for again := 0; again < tries; {
		if env.Router != nil && !asking {
			m, err := env.Router.Current(ctx)
			if err != nil {
				return env.Unavailable(err), Failed
			}
			gen = m.Gen
			if addr = m.Master(pl.Slot); addr == "" {
				if !pause(ctx, deadline) {
					return []byte("-CLUSTERDOWN Hash slot not served\r\n"), Failed
				}
				env.Router.Reload(ctx, gen)
				continue
			}
		}
		c, reused, err := env.Conn(ctx, addr)
		if err != nil {
			if env.Router != nil {
				env.Router.Reload(ctx, gen)
			}
			return env.Unavailable(err), Failed
		}
		res, reply, record, redir, err := attempt(ctx, env.Router != nil, c, pl, asking)
		if err != nil {
			env.Drop(addr)
			if res == fenceLost && reused && !lost {
				// A connection that broke while unused (a failover, a
				// restart): nothing of this FENCED ran; once more on a
				// new one.
				lost = true
				continue
			}
			return env.Unavailable(err), Failed
		}
		asking = false
		switch res {
		case fenceDone:
			if len(reply) > 0 && reply[0] == '-' && !pl.ran(reply) {
				if bytes.HasPrefix(reply, readonlyReply) && env.Follow != nil {
					// The primary was demoted and nothing ran: the
					// follower looks for the new one.
					env.Follow.Trouble(true)
					env.Drop(addr)
					if pause(ctx, deadline) {
						continue
					}
					return env.Unavailable(errReplica), Failed
				}
				return reply, Failed
			}
			return reply, Accepted
		case fenceStale:
			msg := fmt.Sprintf("STALEFENCE fence %d is below %s for '%s'", pl.Req.Fence, record, pl.Req.Resource)
			if pl.Req.Slot >= 0 {
				msg += " slot " + strconv.FormatInt(pl.Req.Slot, 10)
			}
			return errLine(msg), Stale
		case fenceAgain:
			again++
			continue
		case fenceRedirect:
			if env.Router == nil {
				return reply, Failed
			}
			switch redir.kind {
			case cluster.RedirMoved:
				env.Router.Moved.Add(1)
				env.Router.Reload(ctx, gen)
				if env.Router.Gen.Load() == gen && !pause(ctx, deadline) {
					// The slot map was read moments ago: wait for the
					// next reading rather than spin.
					return reply, Failed
				}
			case cluster.RedirAsk:
				env.Router.Asked.Add(1)
				addr, asking = redir.addr, true
			default: // TRYAGAIN, CLUSTERDOWN
				if !pause(ctx, deadline) {
					return reply, Failed
				}
				env.Router.Reload(ctx, gen)
			}
			if time.Now().After(deadline) {
				return reply, Failed
			}
		}
	}
	return errLine("ERR FENCED gave up: the fence record kept changing"), Failed
}

// ran reports whether reply, an error a FENCED transaction ended with, is
// the command's own reply from EXEC (it ran) rather than a refusal before
// it ran. attempt marks the latter with pl.RefusedReply.
func (pl *Plan) ran(reply []byte) bool { return !bytes.Equal(reply, pl.RefusedReply) }

// readonlyReply starts a replica's refusal of a write.
var readonlyReply = []byte("-READONLY ")

// errReplica is why a FENCED could not run while the backend it reached
// was a replica until the retries ran out.
var errReplica = errors.New("the backend is a replica and no primary took its place in time")

// pause waits a little before trying a cluster that is changing
// again; false when deadline or ctx ends first.
func pause(ctx context.Context, deadline time.Time) bool {
	if time.Now().Add(20 * time.Millisecond).After(deadline) {
		return false
	}
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// fencedRedirect is a cluster's cluster.Redirection of a FENCED's commands.
type fencedRedirect struct {
	kind cluster.Redirection
	addr string
}

// parseRedirect returns the cluster.Redirection an error reply is, if any.
func parseRedirect(reply []byte) (fencedRedirect, bool) {
	kind, addr := cluster.Redirected(reply)
	return fencedRedirect{kind: kind, addr: addr}, kind != cluster.RedirNone
}

// attempt runs the transaction once on c. err is set when the connection
// failed: res is then fenceLost when nothing of the transaction had been
// written yet beyond WATCH and GET.
//
// The record is read under WATCH (round one), then MULTI ... EXEC runs
// (round two). Round two ends with the next FENCED's round one, WATCH and
// GET of the same record again (prefetch): a client that fences the same
// resource again finds the record read and watched, and its FENCED takes
// one round trip. A record that changed since makes that EXEC abort, and
// the attempt is made again with the record read after it.
func attempt(ctx context.Context, clustered bool, c *Conn, pl *Plan, asking bool) (res fenceResult, reply []byte, record []byte, redir fencedRedirect, err error) {
	be := c.be
	deadline, _ := ctx.Deadline()
	be.NC.SetDeadline(deadline)
	defer be.NC.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { be.NC.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	// In front of a cluster the command's keys are watched too: WATCH is
	// a command of several keys, which a master that is migrating the
	// slot answers TRYAGAIN while the record and the keys are split
	// between it and the other master (or ASK when all have gone), so
	// that the record read is the one beside the keys.
	w := append(make([][]byte, 0, 2+len(pl.Keys)), []byte("WATCH"), pl.Record)
	if clustered {
		w = append(w, pl.Keys...)
	}
	watch := resp.Encode(w)
	get := resp.Encode([][]byte{[]byte("GET"), pl.Record})

	var cur []byte
	prefetched := !asking && c.watched != nil && bytes.Equal(c.watched, watch)
	if prefetched {
		cur = c.prefetch
		if rec, _ := strconv.ParseInt(string(cur), 10, 64); cur != nil && pl.Req.Fence < rec {
			// Refused only on a record read now: a FLUSHDB may have
			// removed it since.
			prefetched = false
		}
	}
	c.watched = nil
	if !prefetched {
		replies, err := c.watchRecord(watch, get, asking)
		if err != nil {
			return fenceLost, nil, nil, fencedRedirect{}, err
		}
		for _, r := range replies {
			if len(r) > 0 && r[0] == '-' {
				r = bytes.Clone(r) // unwatch reads into the same buffer
				c.unwatch()
				if rd, ok := parseRedirect(r); ok {
					return fenceRedirect, r, nil, rd, nil
				}
				pl.RefusedReply = r
				return fenceDone, r, nil, fencedRedirect{}, nil
			}
		}
		var ok bool
		if cur, ok = bulkValue(replies[1]); !ok {
			c.unwatch()
			pl.RefusedReply = []byte("-ERR FENCED found the fence record not an integer\r\n")
			return fenceDone, pl.RefusedReply, nil, fencedRedirect{}, nil
		}
	}
	if cur != nil {
		rec, err := strconv.ParseInt(string(cur), 10, 64)
		if err != nil {
			c.unwatch()
			pl.RefusedReply = []byte("-ERR FENCED found the fence record not an integer\r\n")
			return fenceDone, pl.RefusedReply, nil, fencedRedirect{}, nil
		}
		if pl.Req.Fence < rec {
			// The WATCH stays, with the record read: the next FENCED
			// of this record may use it.
			cur = bytes.Clone(cur)
			if !asking {
				c.watched, c.prefetch = watch, cur
			}
			return fenceStale, nil, cur, fencedRedirect{}, nil
		}
	}
	exec, queued, lost, err := c.exec(pl, watch, get, asking)
	if err != nil {
		if lost {
			return fenceLost, nil, nil, fencedRedirect{}, err
		}
		return fenceDone, nil, nil, fencedRedirect{}, err
	}
	res, reply, redir, err = execOutcome(pl, exec, queued)
	return res, reply, nil, redir, err
}

// watchRecord is round one: WATCH record, GET record (after UNWATCH of
// what another record's prefetch watched; each after ASKING when
// following an ASK). It returns the replies to WATCH and GET.
func (c *Conn) watchRecord(watch, get []byte, asking bool) ([][]byte, error) {
	be := c.be
	n := 2
	if c.watching {
		be.W.Write(cmdUnwatch)
		n++
	}
	if asking {
		be.W.Write(cmdAsking)
	}
	be.W.Write(watch)
	if asking {
		be.W.Write(cmdAsking)
	}
	be.W.Write(get)
	if asking {
		n += 2
	}
	c.watching = true
	if err := be.W.Flush(); err != nil {
		return nil, err
	}
	replies, err := c.readReplies(n)
	if err != nil {
		return nil, err
	}
	replies = replies[n-2-btoi(asking)*2:]
	if asking {
		replies = [][]byte{replies[1], replies[3]}
	}
	return replies, nil
}

// exec is round two: MULTI, SET record fence (a write), the command,
// EXEC; then the prefetch, WATCH and GET, unless following an ASK. It
// returns EXEC's reply and the replies to the commands queued (SET's and
// the command's). lost is set with err when the connection was closed
// before anything was written.
func (c *Conn) exec(pl *Plan, watch, get []byte, asking bool) (exec []byte, queued [][]byte, lost bool, err error) {
	be := c.be
	if asking {
		be.W.Write(cmdAsking)
	}
	be.W.Write(resp.CmdMulti)
	n := 3
	if pl.Write {
		be.W.Write(resp.Encode([][]byte{[]byte("SET"), pl.Record, strconv.AppendInt(nil, pl.Req.Fence, 10)}))
		n++
	}
	be.W.Write(pl.Raw)
	be.W.Write(cmdExec)
	if asking {
		n++
	} else {
		be.W.Write(watch)
		be.W.Write(get)
		n += 2
	}
	c.watching = !asking
	if err := be.W.Flush(); err != nil {
		// Closed before anything was written: the follower closes the
		// connections to a primary that was replaced.
		return nil, nil, errors.Is(err, net.ErrClosed), err
	}
	replies, err := c.readReplies(n)
	if err != nil {
		return nil, nil, false, err
	}
	if asking {
		replies = replies[1:]
	} else {
		c.keepPrefetch(watch, replies[len(replies)-2], replies[len(replies)-1])
		replies = replies[:len(replies)-2]
	}
	return replies[len(replies)-1], replies[1 : len(replies)-1], false, nil
}

// execOutcome tells what EXEC's reply, exec, and the replies to the
// commands queued before it make of the attempt.
func execOutcome(pl *Plan, exec []byte, queued [][]byte) (fenceResult, []byte, fencedRedirect, error) {
	switch {
	case len(exec) == 0:
	case exec[0] == '-':
		// EXECABORT: a command failed to queue; its error is the
		// reply, the command's own first.
		for i := len(queued) - 1; i >= 0; i-- {
			if q := queued[i]; len(q) > 0 && q[0] == '-' {
				if rd, ok := parseRedirect(q); ok {
					return fenceRedirect, q, rd, nil
				}
				pl.RefusedReply = q
				return fenceDone, q, fencedRedirect{}, nil
			}
		}
		if rd, ok := parseRedirect(exec); ok {
			return fenceRedirect, exec, rd, nil
		}
		pl.RefusedReply = exec
		return fenceDone, exec, fencedRedirect{}, nil
	case bytes.Equal(exec, replyNull2) || bytes.Equal(exec, replyNull3):
		return fenceAgain, nil, fencedRedirect{}, nil
	case exec[0] == '*':
		if body, ok := execBody(exec, pl.Write); ok {
			return fenceDone, body, fencedRedirect{}, nil
		}
	}
	return fenceDone, nil, fencedRedirect{}, fmt.Errorf("unexpected EXEC reply %q", truncate(exec, 64))
}

// keepPrefetch keeps the record read by the WATCH and GET that followed an
// EXEC, when both succeeded.
func (c *Conn) keepPrefetch(watch, watchReply, getReply []byte) {
	v, ok := bulkValue(getReply)
	if !ok || !bytes.Equal(watchReply, resp.ReplyOK) {
		return
	}
	if v != nil {
		if _, err := strconv.ParseInt(string(v), 10, 64); err != nil {
			return
		}
	}
	c.watched, c.prefetch = watch, bytes.Clone(v)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// unwatch ends the WATCH of a transaction that will not run.
func (c *Conn) unwatch() error {
	c.watched, c.watching = nil, false
	c.be.W.Write(cmdUnwatch)
	if err := c.be.W.Flush(); err != nil {
		return err
	}
	_, err := c.readReplies(1)
	return err
}

// readReplies reads n whole replies from be into c's buffer; they are
// valid until the next call.
func (c *Conn) readReplies(n int) ([][]byte, error) {
	if c.w == nil {
		c.w = bufio.NewWriterSize(&c.buf, 512)
	}
	c.buf.Reset()
	c.ends = c.ends[:0]
	var ri resp.ReplyInfo
	for range n {
		if err := resp.CopyReply(c.w, c.be.R, &ri); err != nil {
			return nil, err
		}
		c.w.Flush()
		c.ends = append(c.ends, c.buf.Len())
	}
	b := c.buf.Bytes()
	out := c.replies[:0]
	start := 0
	for _, end := range c.ends {
		out = append(out, b[start:end:end])
		start = end
	}
	c.replies = out
	return out, nil
}

// bulkValue returns a GET's value, nil for none; ok false when the reply
// is neither.
func bulkValue(reply []byte) ([]byte, bool) {
	if bytes.Equal(reply, []byte("$-1\r\n")) || bytes.Equal(reply, replyNull3) {
		return nil, true
	}
	if len(reply) < 4 || reply[0] != '$' {
		return nil, false
	}
	i := bytes.Index(reply, []byte("\r\n"))
	n, err := strconv.Atoi(string(reply[1:i]))
	if err != nil || i+2+n+2 != len(reply) {
		return nil, false
	}
	return reply[i+2 : i+2+n], true
}

// execBody returns the command's reply inside EXEC's: the last of one
// element (a read) or of two, after SET's +OK (a write).
func execBody(exec []byte, write bool) ([]byte, bool) {
	i := bytes.Index(exec, []byte("\r\n"))
	if i < 0 {
		return nil, false
	}
	want := "*1"
	if write {
		want = "*2"
	}
	if string(exec[:i]) != want {
		return nil, false
	}
	body := exec[i+2:]
	if write {
		if !bytes.HasPrefix(body, resp.ReplyOK) {
			return nil, false
		}
		body = body[len(resp.ReplyOK):]
	}
	return body, true
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// Probe answers a FENCED whose command Redis does not know or would
// refuse for its number of arguments with Redis's own error: the command
// is queued in a transaction that is then discarded, so it never runs.
func Probe(ctx context.Context, env *Env, pl *Plan) ([]byte, Outcome) {
	addr := ""
	if env.Router != nil {
		m, err := env.Router.Current(ctx)
		if err != nil {
			return env.Unavailable(err), Failed
		}
		if addr = m.Master(0); addr == "" && len(m.Masters) > 0 {
			addr = m.Masters[0]
		}
	}
	c, _, err := env.Conn(ctx, addr)
	if err != nil {
		return env.Unavailable(err), Failed
	}
	be := c.be
	deadline, _ := ctx.Deadline()
	be.NC.SetDeadline(deadline)
	defer be.NC.SetDeadline(time.Time{})
	be.W.Write(resp.CmdMulti)
	be.W.Write(pl.Raw)
	be.W.Write(resp.CmdDiscard) // which ends any WATCH too
	c.watched, c.watching = nil, false
	var replies [][]byte
	if err = be.W.Flush(); err == nil {
		replies, err = c.readReplies(3)
	}
	if err != nil {
		env.Drop(addr)
		return env.Unavailable(err), Failed
	}
	if r := replies[1]; len(r) > 0 && r[0] == '-' {
		return r, Failed
	}
	return errLine(fmt.Sprintf("ERR FENCED cannot tell the keys of '%s'", pl.Name)), Failed
}

// errLine is the error reply with the text msg ("ERR ...", "STALEFENCE ...").
func errLine(msg string) []byte {
	return append(append([]byte{'-'}, msg...), '\r', '\n')
}
