// Package clientid keeps which client of the proxy each id belongs to that
// CLIENT ID gave it through the proxy. CLIENT KILL ID, CLIENT UNBLOCK and
// CLIENT TRACKING ... REDIRECT name a client by that id, and the proxy,
// not the server, knows which of its clients the server connection behind
// the id serves: in front of one Redis the sessions' registry (proxy's
// identity.go), in front of a cluster the cluster clients'
// (clusterclient's tracking.go, unblock.go).
package clientid

import "sync"

// Registry is the clients of type T by id. Safe for concurrent use.
type Registry[T comparable] struct {
	m sync.Map // int64 -> T
}

// Held is the ids one client was given and what each was registered as.
// The zero value is empty.
type Held[T comparable] struct {
	mu  sync.Mutex
	ids map[int64]T
}

// Add registers id as c's and records it in h, c's own.
func (r *Registry[T]) Add(h *Held[T], id int64, c T) {
	r.m.Store(id, c)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ids == nil {
		h.ids = map[int64]T{}
	}
	h.ids[id] = c
}

// Load returns the client id was given to.
func (r *Registry[T]) Load(id int64) (c T, ok bool) {
	v, ok := r.m.Load(id)
	if !ok {
		return c, false
	}
	return v.(T), true
}

// Forget removes h's ids from r, each only while it is still registered as
// h recorded it (an id the server gave again to another client stays),
// once h's client has gone.
func (r *Registry[T]) Forget(h *Held[T]) {
	h.mu.Lock()
	ids := h.ids
	h.ids = nil
	h.mu.Unlock()
	for id, c := range ids {
		r.m.CompareAndDelete(id, c)
	}
}
