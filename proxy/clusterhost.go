package proxy

import (
	"context"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// The session is the host of its cluster client's plans (clusterHost):
// the barriers and the state the plan of a command asks for.

func (s *session) Context() context.Context { return s.ctx }

func (s *session) Settle() { s.settleCluster() }

func (s *session) Owed() bool {
	cs := s.cl
	return (cs.sharedUsed || cs.ownUsed) && !cs.order.Drained()
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
	cs.stopTracking()
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
	case "setname", "no-evict", "no-touch":
		k = replayedClient([]byte(kind)) // clusterclient.go
	}
	cs := s.cl
	cs.st.learn(k, raw, proto)
	cs.stateChanged()
}

// ClientState plans the CLIENT subcommands whose state the session keeps
// (clusterclient.go, clustertracking.go, clusterunblock.go).
func (s *session) ClientState(m *cluster.SlotMap, sub string, cmd redcon.Command) (cluster.Call, bool) {
	args := cmd.Args
	switch sub {
	case "reply":
		return s.clientReply(args)
	case "id":
		if len(args) == 2 {
			return s.clientIDCall(m, cmd), true
		}
	case "tracking":
		return s.trackingCall(m, cmd)
	case "getredir":
		if len(args) == 2 {
			return s.getRedir(), true
		}
	case "trackinginfo":
		if len(args) == 2 {
			return s.trackingInfoCall(m, cmd), true
		}
	case "unblock":
		if s.unblockCall(args) {
			return cluster.Call{Kind: cluster.CallLocal}, true // answered in its place
		}
	case "caching":
		if s.cl.trk.Load() != nil {
			return s.cachingCall(m, cmd), true
		}
		// Redis's error: not tracking (on the first master).
	}
	return cluster.Call{}, false
}

var _ cluster.Host = (*session)(nil)
