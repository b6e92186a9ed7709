package proxy

import (
	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// upstream is what a session asks where each command goes, by the kind of
// backend behind the proxy: which connection, other than the client's
// connection of one, carries it, and how that one is dialled. Its two
// kinds are one Redis, or the primary a Sentinel names (single), and a
// Redis Cluster (clusterUp, whose clusterclient.Client routes each
// command by the slot map; see clusterhost.go). Both hand their commands to the same machinery,
// internal/backend's (Mux): the shared connections, the connections of one client
// (backend.NewOne, which the session keeps and matches against its
// connection state: session.forwardBackend, Frame), and a cluster
// client's own connections. Each session has its own, made with it and
// knowing it; only the session's forwarder calls it.
type upstream interface {
	// forward sends cmd on the connection it goes to and reports
	// forwarded; or returns it, the proxy's own reply in cmd's place; or
	// reports dedicated: cmd goes on the client's connection of one,
	// after the replies owed on the others.
	forward(name []byte, cmd redcon.Command) (it localItem, forwarded, dedicated bool)
	// dial dials the client's connection of one in the state st.
	dial(st replayState) (*backendConn, error)
}

var (
	_ upstream = single{}
	_ upstream = clusterUp{}
)

// single is one Redis behind the proxy, or the primary a Sentinel names
// (Proxy.dial follows it). A client's stateless commands go on its shared
// connection (session.sh) until its first other command; from then on,
// all of them go on its connection of one (backend.NewOne).
type single struct{ s *session }

func (u single) forward(name []byte, cmd redcon.Command) (localItem, bool, bool) {
	s := u.s
	if s.sh == nil || s.dedicated {
		return localItem{}, false, true
	}
	e := classify(name, cmd)
	// CLIENT is not stateless: a client still on its shared connection
	// has every reply on.
	if e.kind == entryQuit {
		// A client without a connection of its own has nothing to close
		// on the backend: the proxy answers QUIT as Redis does.
		return localItem{reply: replyOK, silent: s.silent(), quit: true}, false, false
	}
	if resp.Stateless(name) {
		s.queuing = e
		if err := s.sh.Queue(s, 0, nil, cmd.Raw, true); err != nil {
			s.p.m.unavailable.Add(1)
			return localItem{reply: resp.ErrorReply(&BackendError{Err: err})}, false, false
		}
		s.sharedOut, s.waitStale = true, true
		s.p.m.forwarded.Add(1)
		return localItem{}, true, false
	}
	// Replies on the shared connection come first; from now on the
	// client's commands go to a connection of its own.
	s.settleShared()
	s.dedicated = true
	return localItem{}, false, true
}

func (u single) dial(st replayState) (*backendConn, error) {
	return u.s.p.dedicated(u.s.ctx, st)
}
