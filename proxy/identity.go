package proxy

// A client's identity in front of one Redis. The id CLIENT ID answers is
// the client's dedicated connection's (CLIENT is a command of the
// dedicated connection), and CLIENT KILL ID of that id from another
// client kills that connection. Redis then closes the killed client's
// connection; the proxy, which keeps a client whose backend connection
// was lost and dials again, would leave it open. So the proxy remembers
// which client each id CLIENT ID gave belongs to, and when CLIENT KILL
// with an ID filter naming another client's id answers that it killed a
// connection, it closes that client's connection too, as Redis does. The
// other filters (ADDR, LADDR, TYPE, USER, MAXAGE, SKIPME) name the proxy's
// connections to the backend and are the backend's alone; a client that
// kills its own id (SKIPME no) keeps its connection (README, "Connection
// identity"). In front of a cluster, clusterclient's killCall does the
// same with the ids of the slot-0 master.

// clientID is a registered id: the client, and its dedicated connection
// the id was of. Once the client has dialed another, the id names no
// connection of its any more (a backend restarted or failed over may
// give it to another).
type clientID struct {
	s  *session
	be *backendConn
}

// dedicatedConn returns the client's dedicated connection.
func (s *session) dedicatedConn() *backendConn {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	return s.q.be
}

// identity is told the integer reply of a CLIENT ID (n: the id) or of a
// CLIENT KILL with an ID filter (id: the filter's, n: how many were
// killed).
func (s *session) identity(kind entryKind, id, n int64) {
	switch kind {
	case entryClientID:
		be := s.dedicatedConn()
		if be == nil {
			return
		}
		s.p.clientIDs.Add(&s.ids, n, clientID{s, be})
	case entryKill:
		if n == 0 {
			return
		}
		if c, ok := s.p.clientIDs.Load(id); ok && c.s != s && c.s.dedicatedConn() == c.be {
			c.s.Disconnect()
		}
	}
}
