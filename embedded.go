package main

import (
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"
)

// embeddedNodes are in-process Redis-compatible servers (miniredis) for a
// configuration that names "embedded" instead of an address: for trying
// lockproxy out, not for production (they keep nothing and implement a
// subset of Redis). Their owner calls close, which stops the servers.
type embeddedNodes struct {
	nodes []*miniredis.Miniredis
}

// resolve returns addr, or for "embedded" the address of a new embedded
// node.
//
// The node's clock is the wall clock (miniredis's ClockTTL): keys expire as
// time passes, and TIME, which the lock engine reads on every call to
// place the node's clock, is always the current time. A clock set by a
// ticker (SetTime every few ms) stood still between ticks and lagged
// behind on a loaded machine, then jumped: the lock engine took the jump
// for a clock that ran ahead and the node for one that lost its data.
func (e *embeddedNodes) resolve(addr string) (string, error) {
	addr = strings.TrimSpace(addr)
	if addr != embedded { // "" too: the backend is a cluster
		return addr, nil
	}
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return "", fmt.Errorf("embedded node: %w", err)
	}
	e.nodes = append(e.nodes, m)
	return m.Addr(), nil
}

// close stops the nodes.
func (e *embeddedNodes) close() {
	for _, m := range e.nodes {
		m.Close()
	}
}

// start resolves the backend's and the lock nodes' addresses in cfg,
// starting an embedded node for each "embedded".
func (e *embeddedNodes) start(cfg *fileConfig) (backend string, lock []string, err error) {
	if backend, err = e.resolve(cfg.Backend.Addr); err != nil {
		return "", nil, err
	}
	lock = make([]string, len(cfg.Lock.Nodes))
	for i, a := range cfg.Lock.Nodes {
		if lock[i], err = e.resolve(a); err != nil {
			return "", nil, err
		}
	}
	return backend, lock, nil
}
