package commands

import (
	"hash/maphash"
	"slices"
	"sync"
)

// holders indexes which connections of a Handler record a holding of a
// token, so that a release through one connection ends the record on the
// others. A pooled client takes a lock on one connection and releases it
// by token on another; without the index the first connection would go
// on counting the released holding until its validity ran out, and its
// token-less UNLOCK or EXTEND would name a holding count it no longer
// has (two readers taken, one released elsewhere: "holds 'r' 2 times").
//
// A connection records at most one holding per (resource, token) (record
// replaces the earlier one), so the index is a set of connections per
// pair. It is sharded by token so that connections taking locks at once
// seldom wait for each other. The lock order is a Conn's mu, then a
// shard's.
type holders struct {
	seed   maphash.Seed
	shards [holderShards]holderShard
}

const holderShards = 32

type holderShard struct {
	mu sync.Mutex
	m  map[lockID]*conns
}

// conns is the set of connections recording one holding: nearly always
// one, so the first is kept apart from the rest.
type conns struct {
	first *Conn
	more  []*Conn
}

func newHolders() *holders {
	x := &holders{seed: maphash.MakeSeed()}
	for i := range x.shards {
		x.shards[i].m = make(map[lockID]*conns)
	}
	return x
}

func (x *holders) shard(id lockID) *holderShard {
	return &x.shards[maphash.String(x.seed, id.token)%holderShards]
}

// add records that c holds id.
func (x *holders) add(id lockID, c *Conn) {
	s := x.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.m[id]
	switch {
	case set == nil:
		s.m[id] = &conns{first: c}
	case set.first == c:
	default:
		for _, o := range set.more {
			if o == c {
				return
			}
		}
		set.more = append(set.more, c)
	}
}

// remove records that c no longer holds id.
func (x *holders) remove(id lockID, c *Conn) {
	s := x.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.m[id]
	if set == nil {
		return
	}
	if set.first == c {
		if len(set.more) == 0 {
			delete(s.m, id)
			return
		}
		set.first = set.more[len(set.more)-1]
		set.more = set.more[:len(set.more)-1]
		return
	}
	for i, o := range set.more {
		if o == c {
			set.more[i] = set.more[len(set.more)-1]
			set.more = set.more[:len(set.more)-1]
			return
		}
	}
}

// others returns the connections other than c that record id.
func (x *holders) others(id lockID, c *Conn) []*Conn {
	s := x.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.m[id]
	if set == nil || (set.first == c && len(set.more) == 0) {
		return nil
	}
	var out []*Conn
	for _, o := range append([]*Conn{set.first}, set.more...) {
		if o != c {
			out = append(out, o)
		}
	}
	return out
}

// released ends the records of id on the connections other than c once a
// release through c took the holding's last hold: they hold nothing of it
// any more. Only records made before the release began (seq, from
// recordSeq) end: a LOCK ... TOKEN that took the holding again while the
// release ran keeps its record.
func (h *Handler) released(id lockID, c *Conn, seq uint64) {
	for _, o := range h.holders.others(id, c) {
		o.drop(id, seq)
	}
}

// recordSeq returns the number of holdings recorded on the Handler's
// connections so far.
func (h *Handler) recordSeq() uint64 { return h.records.Load() }

// drop ends this connection's record of id, if it has one: the holding
// was released elsewhere. The last record of a resource stays, as one
// whose validity has run out does, so that a token-less UNLOCK or EXTEND
// still names it and answers 0 (not held) once; it counts no more, is no
// longer kept alive and is not released again by Close. Beside other
// records it goes at once.
func (c *Conn) drop(id lockID, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	hs := c.held[id.resource]
	i := slices.IndexFunc(hs, func(h *holding) bool { return h.token == id.token && h.seq <= seq })
	if i < 0 {
		return
	}
	h := hs[i]
	if h.ext != nil {
		h.ext.stop()
	}
	if len(hs) == 1 {
		h.gone, h.keep, h.kept = true, false, 0
		return
	}
	c.h.holders.remove(id, c)
	c.held[id.resource] = slices.Delete(hs, i, i+1)
}
