package proxy

import (
	"github.com/lockproxy/lockproxy/proxy/internal/backend"
)

// The proxy's side of internal/backend's batching (backend.Mux, Group):
// what its connections share (Proxy.mux), how a shared connection is
// dialled, and the order across every group.

// initMux sets up what the proxy's multiplexed connections share; p.acl
// is set.
func (p *Proxy) initMux() {
	e := &p.mux
	e.WriteTimeout, e.Log = p.cfg.Backend.WriteTimeout, p.log
	e.Readers, e.ConnLost = &p.sharedWG, &p.m.connLost
	e.CheckReply, e.Trouble, e.WriteAll = p.checkReply, p.backendTrouble, p.writeQueued
	if a := p.acl; a != nil {
		// Every user's shared connections to one Redis keep one order.
		e.Queued = a.queued
		e.WriteQueued = func(g *backend.Group, limit uint64) {
			if g.Addr() == "" {
				a.writeQueued(limit)
			} else {
				g.WriteQueued(limit)
			}
		}
	}
}

// newMuxGroup makes n shared connections to addr ("" for the backend),
// signed in as ag's user when ag is set (Redis's ACL, acl.go).
func (p *Proxy) newMuxGroup(addr string, n int, ag *aclGroup) *backend.Group {
	return backend.NewGroup(&p.mux, addr, n, func() (*backend.Conn, error) {
		return p.dialShared(addr, ag)
	})
}

// dialShared dials a shared connection to addr, after the backoff.
func (p *Proxy) dialShared(addr string, ag *aclGroup) (*backendConn, error) {
	if err := p.backoff.Check(); err != nil {
		return nil, err
	}
	var st replayState
	if ag != nil {
		st.auth = *ag.auth.Load()
	}
	var be *backendConn
	var err error
	if addr != "" {
		be, err = p.dialAddr(p.root, addr, st)
	} else {
		be, err = p.dial(p.root, st)
	}
	p.backoff.Record(err)
	return be, err
}

// writeQueued writes the commands waiting on the shared connections, the
// batch that has waited longest first, and returns once they have been
// written. Called before a write to the backend, it keeps the order in
// which commands came across connections (see backend.Mux).
func (p *Proxy) writeQueued() {
	// Batches that start after this one are newer than what the caller
	// writes next; they wait for their own turn.
	limit := p.mux.Batches()
	if p.router == nil {
		if p.acl != nil {
			p.acl.writeQueued(limit)
			return
		}
		p.group.WriteQueued(limit)
		return
	}
	for _, g := range p.router.Groups() {
		g.WriteQueued(limit)
	}
}
