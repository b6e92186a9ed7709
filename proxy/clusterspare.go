package proxy

import (
	"context"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
)

// Spare connections to each master of a cluster (backend.Spares): a client's
// own connection to a master is taken from them when there is one, so its
// first command there that cannot share a connection (a blocking XREAD
// or BLPOP, a script, a command after CLIENT SETNAME) costs no dial on
// the client's request path. Dialled there, it could reach the master
// after a command another client sends right after it on a shared
// connection, as with one Redis it cannot: an XREAD BLOCK ... $ would
// then miss an XADD sent after it. Each master the slot map names gets
// Backend.SpareConnections of them, kept until the proxy shuts down.

// keepSpares makes sure every master in masters has its spares.
func (r *router) keepSpares(masters []string) {
	n := r.p.cfg.Backend.SpareConnections
	if n <= 0 {
		return
	}
	r.spMu.Lock()
	defer r.spMu.Unlock()
	if r.spClosed {
		return
	}
	if r.spares == nil {
		r.spares = map[string]*backend.Spares{}
	}
	for _, addr := range masters {
		if r.spares[addr] == nil {
			sp := backend.NewSpares(n, func(ctx context.Context) (*backend.Conn, error) {
				return r.p.spare(ctx, addr)
			})
			r.spares[addr] = sp
			sp.Start(r.p.root)
		}
	}
}

// dedicated returns a connection of a client's own to the master at
// addr, brought to state: a spare one when there is one, a new one
// otherwise.
func (r *router) dedicated(ctx context.Context, addr string, state replayState) (*backendConn, error) {
	r.spMu.Lock()
	sp := r.spares[addr]
	r.spMu.Unlock()
	if c := sp.Take(); c != nil {
		be := c
		if cmds := state.commands(nil); len(cmds) > 0 {
			ctx, cancel := context.WithTimeout(ctx, r.p.cfg.Backend.DialTimeout)
			defer cancel()
			setup := be.Setup
			if r.p.acl != nil && state.auth != nil {
				// A user of Redis's ACL signs in as on a new
				// connection (aclState.dialSetup).
				setup = func(ctx context.Context, cmds [][]byte) error { return r.p.acl.setup(ctx, be, cmds) }
			}
			if err := setup(ctx, cmds); err != nil {
				be.NC.Close()
				return nil, err
			}
		}
		return be, nil
	}
	return r.p.dialAddr(ctx, addr, state)
}

// closeSpares closes the spares not taken and waits for their fillers;
// the proxy's root context has ended.
func (r *router) closeSpares() {
	r.spMu.Lock()
	r.spClosed = true
	all := r.spares
	r.spares = nil
	r.spMu.Unlock()
	for _, sp := range all {
		sp.Close(true)
	}
}
