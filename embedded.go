package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// embeddedNodes are in-process Redis-compatible servers (miniredis) for a
// configuration that names "embedded" instead of an address: for trying
// lockproxy out, not for production (they keep nothing and implement a
// subset of Redis). Their owner calls close, which stops the clock
// goroutine and the servers.
type embeddedNodes struct {
	nodes []*miniredis.Miniredis
	stop  chan struct{}
	done  chan struct{}
}

// resolve returns addr, or for "embedded" the address of a new embedded
// node.
func (e *embeddedNodes) resolve(addr string) (string, error) {
	addr = strings.TrimSpace(addr)
	if addr != embedded { // "" too: the backend is a cluster
		return addr, nil
	}
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return "", fmt.Errorf("embedded node: %w", err)
	}
	e.nodes = append(e.nodes, m)
	return m.Addr(), nil
}

// tick starts advancing the embedded nodes' clocks: miniredis expires keys
// only when told that time has passed, and locks must expire. It does
// nothing when there are no embedded nodes.
func (e *embeddedNodes) tick() {
	if len(e.nodes) == 0 {
		return
	}
	e.stop, e.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(e.done)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-e.stop:
				return
			case now := <-t.C:
				for _, m := range e.nodes {
					m.SetTime(now)
					m.FastForward(now.Sub(last))
				}
				last = now
			}
		}
	}()
}

// close stops the clock and the nodes.
func (e *embeddedNodes) close() {
	if e.stop != nil {
		close(e.stop)
		<-e.done
	}
	for _, m := range e.nodes {
		m.Close()
	}
}

// start resolves the backend's and the lock nodes' addresses in cfg,
// starting an embedded node for each "embedded", and starts their clock.
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
	e.tick()
	return backend, lock, nil
}
