package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Docs describes the proxy's own commands to COMMAND, COMMAND INFO, COMMAND
// COUNT, COMMAND LIST and COMMAND DOCS, so that redis-cli shows hints for
// them and clients that look commands up accept them. Every other reply of
// COMMAND is the backend's.
type Docs struct {
	// Names are the commands, in lower case.
	Names []string
	// AppendInfo appends one entry of COMMAND INFO; AppendDocs the value
	// of one entry of COMMAND DOCS.
	AppendInfo func(dst []byte, name string, resp3 bool) []byte
	AppendDocs func(dst []byte, name string, resp3 bool) []byte
}

// infoSection is the argument of INFO the proxy answers itself.
const infoSection = "lockproxy"

// intercept reports whether the proxy answers cmd itself although it is no
// lock command, and returns how to build the reply: INFO lockproxy and the
// COMMAND subcommands that must list the proxy's commands.
func (s *session) intercept(name []byte, args [][]byte) (func(resp3 bool) ([]byte, error), bool) {
	switch string(name) {
	case "info":
		if s.p.cfg.Info != nil && len(args) == 2 && bytes.EqualFold(args[1], []byte(infoSection)) {
			return s.p.infoReply, true
		}
	case "command":
		d := s.p.cfg.Docs
		if d == nil {
			return nil, false
		}
		if len(args) == 1 {
			return func(resp3 bool) ([]byte, error) { return s.p.commandInfo(nil, resp3) }, true
		}
		var sb [24]byte
		switch sub := string(resp.Lower(&sb, args[1])); {
		case sub == "count" && len(args) == 2:
			return s.p.commandCount, true
		case sub == "list" && len(args) == 2:
			return s.p.commandList, true
		case sub == "info":
			return func(resp3 bool) ([]byte, error) { return s.p.commandInfo(args[2:], resp3) }, true
		case sub == "docs":
			return func(resp3 bool) ([]byte, error) { return s.p.commandDocs(args[2:], resp3) }, true
		}
	}
	return nil, false
}

func (p *Proxy) infoReply(resp3 bool) ([]byte, error) {
	body := "# Lockproxy\r\n" + p.cfg.Info()
	if p.router != nil {
		body += p.router.Info()
	}
	if !resp3 {
		return redcon.AppendBulkString(nil, body), nil
	}
	// Redis answers INFO with a verbatim string in RESP3.
	b := []byte("=")
	b = strconv.AppendInt(b, int64(len(body)+4), 10)
	return append(append(append(b, "\r\ntxt:"...), body...), "\r\n"...), nil
}

func (p *Proxy) commandCount(resp3 bool) ([]byte, error) {
	reply, err := p.query(resp3, "COMMAND", "COUNT")
	if err != nil || reply[0] != ':' {
		return reply, err
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(reply[1:])), 10, 64)
	if err != nil {
		return nil, err
	}
	return redcon.AppendInt(nil, n+int64(len(p.cfg.Docs.Names))), nil
}

func (p *Proxy) commandList(resp3 bool) ([]byte, error) {
	reply, err := p.query(resp3, "COMMAND", "LIST")
	if err != nil {
		return nil, err
	}
	typ, elems, err := resp.SplitAggregate(reply)
	if err != nil {
		return reply, nil // an error reply, or a backend without COMMAND LIST
	}
	for _, n := range p.cfg.Docs.Names {
		elems = append(elems, redcon.AppendBulkString(nil, n))
	}
	return resp.JoinAggregate(typ, len(elems), elems), nil
}

// commandInfo answers COMMAND INFO names (all commands when names is
// empty), in the order asked, taking the backend's entries for the
// backend's commands.
func (p *Proxy) commandInfo(names [][]byte, resp3 bool) ([]byte, error) {
	d := p.cfg.Docs
	own, rest := p.split(names)
	var theirs [][]byte
	typ := byte('*')
	if len(names) == 0 || len(rest) > 0 {
		q := append([]string{"COMMAND", "INFO"}, rest...)
		reply, err := p.query(resp3, q...)
		if err != nil {
			return nil, err
		}
		if typ, theirs, err = resp.SplitAggregate(reply); err != nil {
			return reply, nil
		}
	}
	if len(names) == 0 {
		for _, n := range d.Names {
			theirs = append(theirs, d.AppendInfo(nil, n, resp3))
		}
		return resp.JoinAggregate(typ, len(theirs), theirs), nil
	}
	out := make([][]byte, len(names))
	for i := range names {
		if n, ok := own[i]; ok {
			out[i] = d.AppendInfo(nil, n, resp3)
		} else if len(theirs) > 0 {
			out[i], theirs = theirs[0], theirs[1:]
		}
	}
	return resp.JoinAggregate(typ, len(out), out), nil
}

// commandDocs answers COMMAND DOCS: a map from name to docs, with the
// proxy's own commands added.
func (p *Proxy) commandDocs(names [][]byte, resp3 bool) ([]byte, error) {
	d := p.cfg.Docs
	own, rest := p.split(names)
	var pairs [][]byte
	typ := byte('*')
	if resp3 {
		typ = '%'
	}
	if len(names) == 0 || len(rest) > 0 {
		q := append([]string{"COMMAND", "DOCS"}, rest...)
		reply, err := p.query(resp3, q...)
		if err != nil {
			return nil, err
		}
		t, elems, err := resp.SplitAggregate(reply)
		// A backend whose answer is not a map of names (an embedded
		// miniredis answers with the COMMAND table) would crash redis-cli:
		// it gets the proxy's own docs only.
		if err == nil && (t == '%' || t == '*') && len(elems)%2 == 0 && allBulk(elems) {
			pairs = elems
		}
	}
	for i := 0; i < max(len(names), 1); i++ {
		for _, n := range d.Names {
			if _, ok := own[i]; (len(names) == 0 && i == 0) || (ok && own[i] == n) {
				pairs = append(pairs, redcon.AppendBulkString(nil, n), d.AppendDocs(nil, n, resp3))
			}
		}
	}
	n := len(pairs)
	if typ == '%' {
		n /= 2
	}
	return resp.JoinAggregate(typ, n, pairs), nil
}

// allBulk reports whether every even element (a map key) is a bulk string.
func allBulk(elems [][]byte) bool {
	for i := 0; i < len(elems); i += 2 {
		if elems[i][0] != '$' {
			return false
		}
	}
	return true
}

// split sorts names into the proxy's own (by position) and the rest.
func (p *Proxy) split(names [][]byte) (map[int]string, []string) {
	own := map[int]string{}
	var rest []string
	for i, n := range names {
		var nb [24]byte
		ln := string(resp.Lower(&nb, n))
		found := false
		for _, o := range p.cfg.Docs.Names {
			if ln == o {
				own[i], found = o, true
			}
		}
		if !found {
			rest = append(rest, string(n))
		}
	}
	return own, rest
}

// query runs one command on a fresh backend connection in the client's
// protocol and returns the raw reply. COMMAND is rare and answered once per
// client start, so it does not share the client's own connection, whose
// replies are streaming to the client.
func (p *Proxy) query(resp3 bool, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(p.root, p.cfg.Backend.DialTimeout)
	defer cancel()
	var st replayState
	if resp3 {
		st.hello = command("HELLO", "3")
	}
	be, err := p.dialAny(ctx, st)
	if err != nil {
		return nil, &BackendError{Err: err}
	}
	defer be.NC.Close()
	deadline, _ := ctx.Deadline()
	be.NC.SetDeadline(deadline)
	be.W.Write(command(args...))
	if err := be.W.Flush(); err != nil {
		return nil, &BackendError{Err: err}
	}
	var ri resp.ReplyInfo
	b, err := resp.ReadFrame(be.R, &ri)
	if err != nil {
		return nil, &BackendError{Err: err}
	}
	return b, nil
}

// dialAny opens a connection for one of the proxy's own queries of the
// backend (COMMAND, see query): to the backend, or to any node of a
// cluster, the masters first.
func (p *Proxy) dialAny(ctx context.Context, st replayState) (*backendConn, error) {
	if p.router == nil {
		return p.dial(ctx, st)
	}
	var errs []error
	for _, addr := range p.router.Candidates() {
		be, err := p.dialAddr(ctx, addr, st)
		if err == nil || backend.Refused(err) {
			return be, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%w: %w", cluster.ErrNoNode, errors.Join(errs...))
}
