// Package cluster is where the commands of a client of a Redis Cluster
// go, and none of how they travel: it knows slots, masters and replies,
// and no connection (Order.Put writes to an io.Writer, the client's).
//
//   - router.go: the Router, what the proxy knows of the cluster (the slot
//     map, SlotMap, read from CLUSTER SHARDS; where each command's keys
//     are, from the COMMAND table; the counters of redirections), and
//     KeySlot.
//   - plan.go: a Client, one client's routing state (its transaction and
//     WATCH, the master of its last command with keys), plans each
//     command (Client.Plan) into a Call: to the master of its keys' slot,
//     split per slot, fanned out to every master, SCAN's cursor over the
//     masters, a transaction tied to one master. What the plan needs of
//     the session (the barriers: every reply owed is in; the client's
//     MONITOR, own connections and state; the CLIENT subcommands whose
//     state it keeps: REPLY, ID, TRACKING, CACHING, UNBLOCK) it asks its
//     Host.
//   - call.go: a Call is parts, each to one master, and what makes the
//     client's reply from theirs (Merge, Call.Result); Redirected parses
//     MOVED, ASK, TRYAGAIN and CLUSTERDOWN; tx.go is the transaction and
//     WATCH a part belongs to; waitmark.go the proxy's write before WAIT.
//   - fan.go, acllog.go, slowlog.go, latency.go, pause.go, shardinfo.go:
//     the commands about the whole server, applied to or merged from
//     every master (CONFIG SET of a node's own parameters to one;
//     CLIENT PAUSE and slowlog-max-len remembered by the Router); scan.go
//     is SCAN's cursor and COUNT over the masters; join.go,
//     lcs.go, hll.go, sort.go: the reads the proxy computes from keys in
//     several slots. Each plan is a function of what it needs, and each
//     merge a function of the replies (SORT with BY or GET patterns also
//     of a fetch callback, which reads the keys they name).
//   - order.go: the Order of a client's replies, which come back from
//     several masters in any order: each command takes a ticket when it
//     is queued, the connections' readers put each reply in its place
//     (Order.Put), and a Gather collects a call's parts' replies, the
//     last of which makes the client's reply.
//
// The proxy's cluster*.go files hand the parts to its connections: the
// masters' shared connections, or the client's own.
package cluster
