package proxy

import (
	"context"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// The session is the host of its cluster client's plans (clusterHost):
// the barriers and the state the plan of a command asks for.

func (s *session) Context() context.Context { return s.ctx }

func (s *session) Settle() { s.settleCluster() }

func (s *session) Owed() bool {
	cs := s.cl
	return (cs.sharedUsed || cs.ownUsed) && !cs.order.drained()
}

func (s *session) Unavailable(err error) []byte {
	s.p.m.unavailable.Add(1)
	return resp.ErrorReply(&BackendError{Err: err})
}

func (s *session) Resp3() bool { return s.cl.st.resp3() }

func (s *session) Ask(parts []cluster.Part) [][]byte { return s.ask(parts) }

func (s *session) Clients() int64 { return s.p.clients.Load() }

func (s *session) Monitor(m *cluster.SlotMap) cluster.Call { return s.monitorCall(m) }

func (s *session) MonitorRefuses(name []byte, args [][]byte) bool {
	return s.monitorRefuses(name, args)
}

func (s *session) Reset() {
	cs := s.cl
	cs.dropAll()
	cs.st = clientState{}
	cs.stateChanged()
}

func (s *session) OwnAddrs() []string { return s.cl.ownAddrs() }

func (s *session) Learned(kind string, raw []byte, proto int64) {
	k := entryAuth
	switch kind {
	case "hello":
		k = entryHello
	case "client":
		k = entrySetName
	}
	cs := s.cl
	cs.st.learn(k, raw, proto)
	cs.stateChanged()
}

var _ cluster.Host = (*session)(nil)
