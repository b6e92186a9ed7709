package proxy

import (
	"testing"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// BenchmarkClusterTransaction sends MULTI, SET of a key whose master is
// not slot 0's, and EXEC through the proxy in front of a cluster of three
// masters, as one pipeline per round trip: the path a held MULTI changes
// (plan.go, TxnState.Held).
func BenchmarkClusterTransaction(b *testing.B) {
	c := redistest.StartCluster(b, 3, 0)
	addr, _ := startClusterProxy(b, c)
	k := keyOn(1, "btx:")
	bc := newBenchConn(b, addr, forwardCase{cmd: args("PING")}, 1)
	bc.req = encode(args("MULTI"), args("SET "+k+" v"), args("EXEC"))
	bc.want = []byte("+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n")
	bc.reply = make([]byte, len(bc.want))
	bc.loop(b)
}
