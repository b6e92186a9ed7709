package proxy

import (
	"bytes"
	"context"

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
	defer be.NC.Close()
	return be.Role(ctx)
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
