package cluster

import (
	"bytes"
	"strconv"
	"time"
)

// CLIENT PAUSE in front of a cluster. A paused master holds back the
// writes (or every command) of each of its clients, and serves the
// others' reads, and a client it holds shows in blocked_clients. A shared
// connection is one client to the master: a paused write on it would
// hold back every other client's commands behind it, reads included. So
// while a pause sent through the proxy is in effect (until its timeout or
// a CLIENT UNPAUSE through the proxy), clients' commands go on their own
// connections, and each is held back or served as by one Redis. A pause
// set on the masters directly is not seen.

// LearnPause records a CLIENT PAUSE or UNPAUSE that succeeded (or was
// queued in a transaction).
func (r *Router) LearnPause(args [][]byte) {
	if len(args) < 2 {
		return
	}
	switch {
	case bytes.EqualFold(args[1], []byte("unpause")):
		r.pausedUntil.Store(0)
	case bytes.EqualFold(args[1], []byte("pause")) && len(args) > 2:
		ms, err := strconv.ParseInt(string(args[2]), 10, 64)
		if err != nil || ms < 0 {
			return
		}
		until := time.Now().Add(time.Duration(ms) * time.Millisecond).UnixNano()
		if until > r.pausedUntil.Load() {
			r.pausedUntil.Store(until)
		}
	}
}

// Paused reports whether a pause sent through the proxy may be in
// effect.
func (r *Router) Paused() bool {
	until := r.pausedUntil.Load()
	if until == 0 {
		return false
	}
	if time.Now().UnixNano() < until {
		return true
	}
	r.pausedUntil.CompareAndSwap(until, 0)
	return false
}
