package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
	"github.com/lockproxy/lockproxy/proxy/internal/sentinel"
)

// SentinelConfig finds the backend through Redis Sentinel (the follower,
// internal/sentinel's Follower): see BackendConfig.Sentinel.
type SentinelConfig = sentinel.Config

// BackendStatus is where the proxy forwards to, and what the Sentinels
// said of it.
type BackendStatus = sentinel.Status

// Backend returns where the proxy forwards to. It is safe for concurrent
// use.
func (p *Proxy) Backend() BackendStatus {
	if p.follow == nil {
		return BackendStatus{Primary: p.cfg.Backend.Addr}
	}
	return p.follow.Status()
}

// role asks the server at addr for its ROLE ("master", "slave",
// "sentinel"), on a connection set up as a backend connection is.
func (p *Proxy) role(ctx context.Context, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Backend.DialTimeout)
	defer cancel()
	be, err := p.dialAddr(ctx, addr, replayState{})
	if err != nil {
		return "", err
	}
	defer be.nc.Close()
	deadline, _ := ctx.Deadline()
	be.nc.SetDeadline(deadline)
	if _, err := be.nc.Write(command("ROLE")); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	var ri resp.ReplyInfo
	if err := resp.CopyReply(w, be.r, &ri); err != nil {
		return "", err
	}
	w.Flush()
	// *3\r\n$6\r\nmaster\r\n...
	lines := bytes.SplitN(buf.Bytes(), []byte("\r\n"), 4)
	if ri.Type != '*' || len(lines) < 3 || len(lines[1]) == 0 || lines[1][0] != '$' {
		return "", fmt.Errorf("ROLE answered %q", bytes.TrimSpace(lines[0]))
	}
	return string(lines[2]), nil
}

// readonlyPrefix starts the error a replica gives to a write.
var readonlyPrefix = []byte("-READONLY")

// checkReply tells the follower of a -READONLY reply: the backend is no
// longer the primary.
func (p *Proxy) checkReply(ri *resp.ReplyInfo) {
	if ri.Type == '-' && p.follow != nil && bytes.HasPrefix(ri.Line(), readonlyPrefix) {
		p.follow.Trouble(true)
	}
}

// backendTrouble tells the follower that a backend connection was lost.
func (p *Proxy) backendTrouble() {
	if p.follow != nil {
		p.follow.Trouble(false)
	}
}
