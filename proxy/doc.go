// Package proxy is the Redis endpoint of lockproxy: it owns the client
// connections, answers the proxy's own commands through a Local per
// connection, and forwards every other command to the backend Redis as raw
// RESP, copying the backend's replies back byte for byte.
//
// Connection model: the stateless commands of clients that have set no
// connection state go over a few shared backend connections
// (internal/backend, Mux and Group):
// commands of many clients leave in one write and each reply is routed
// back to its client. At its first command that sets or reads connection
// state, or blocks, a client moves to a dedicated backend connection, so
// everything a client can set on a Redis connection (SELECT, AUTH, HELLO 3,
// CLIENT SETNAME, MULTI, WATCH, subscriptions, MONITOR, blocking commands)
// stays the client's own. That connection is a backend.Mux (a multiplexed
// connection) with one client (backend.NewOne): written by the same
// batching, and read by a reader of its own, which asks the session
// (backend.Owner, session.Frame) and its fifo (below) what each frame
// answers, and reads for as long as the connection lives, since pushes,
// messages and MONITOR lines come while the client sends nothing. The
// move takes one of a few connections kept
// dialed and set up in the background (internal/backend, Spares), so it costs no dial: a
// dial on the request path would let a command another client sends right
// after reach Redis first. A command waiting for its shared connection
// (behind the replies in flight on it) is written before any later
// command goes out on another backend connection (backend.Mux,
// Proxy.writeQueued): batching does not change the order in which the
// proxy passes different clients' commands on. A pipeline read from the
// client in one go is written to the backend in one go. A fifo of the
// commands in flight keeps the proxy's own replies in their place in the
// stream, and recognises pub/sub and MONITOR traffic that answers no
// request. session.forward asks the upstream where each command goes.
// What the proxy knows of each Redis command (does it share a
// connection, block, wait, subscribe, ...) is asked of one table,
// internal/resp's.
//
// WAIT and WAITAOF wait for the replication offset of the connection's
// last write, and go on the client's own connection while its writes may
// have gone on a shared one (or on an own one since lost): a fresh
// connection's WAIT would count every replica at once. Before such a
// WAIT the proxy runs a script of its own on that connection, whose reply
// the client never sees (session.waitMark; in front of a cluster, a part
// of the WAIT's call, waitMark): it sets a key of the proxy's
// (lockproxy:wait-mark, with a hash tag of the write's slot in front of a
// cluster) if it does not exist and deletes it at once, which moves the
// connection's offset to the primary's and changes no key (though it
// shows where any write does: BCAST tracking invalidations, keyspace
// notifications, MONITOR; README lists them). Not inside a
// transaction, where Redis answers WAIT at once, nor while replies are
// off or skipped, or the client subscribed. A client that only read on
// the shared connection gets the mark too: its WAIT then waits for the
// replicas to have every write so far, which is never more than Redis
// promises.
//
// SYNC and PSYNC (with the REPLCONF before them) go over the client's
// own connection like any command, but what answers them is the
// replication stream: a bulk header and an RDB payload with no CRLF after
// it (or one that ends with an EOF mark), newlines before it, then commands
// without end. Unless Redis refuses the SYNC with an error, the connection
// stops being a request/reply exchange there: the proxy copies the
// backend's bytes to the client as they come (session.relay), and sends
// what the client sends (REPLCONF ACK) to the backend without interpreting
// it, until either side closes. This is what replicas, redis-cli --replica
// and --rdb, and Redis's own test suite use.
//
// When the backend connection breaks, the commands waiting on it are
// answered with "-ERR backend unavailable: ...", and the next command opens
// a new connection brought back to the client's state (AUTH, HELLO, CLIENT
// SETNAME, SELECT, CLIENT NO-EVICT and NO-TOUCH, CLIENT REPLY). The
// proxy learns that state from the replies, so a command that sets it
// while CLIENT REPLY OFF or SKIP keeps its reply from the client is sent
// between a CLIENT REPLY ON of the proxy's own and, when replies were
// off, a CLIENT REPLY OFF: the proxy reads that reply, and the client gets
// none of it (connState.reveal). A SKIP spent by a command the proxy
// answers itself is spent on the backend too, by a CLIENT REPLY ON of the
// proxy's own (session.silent). A client
// that was subscribed, monitoring, tracking keys (CLIENT TRACKING) or a
// replica is disconnected instead, so that it notices its subscriptions
// or invalidations are gone. A transaction open on the lost connection
// fails as a whole: its later commands are refused as commands that fail
// to queue, without reaching the backend, and EXEC answers EXECABORT; keys
// WATCHed on it make the next EXEC abort with a null reply (state.go,
// connState.doomed; clusterclient's tx.go for a cluster).
//
// Where a command goes is the upstream's (upstream.go), which the
// session asks for each command; both kinds hand what they send to the
// same machinery, internal/backend's batching: the shared connections,
// and connections of one client (a client of one Redis's own, and a
// cluster client's pinned pub/sub connection). With one Redis, or the primary a Sentinel names (sentinel.go), the
// upstream is single: the rules above. With a Redis
// Cluster behind it (BackendConfig.Cluster), it is clusterUp, which
// hands each command to the client's clusterclient.Client (s.cl): it
// routes each command by the slot of its keys to the master serving it;
// internal/cluster plans each command (the routing, in one place), and
// internal/clusterclient sends what it plans, asking the session (its
// Host, clusterhost.go) for what the session keeps. The stateless one-slot commands of clients
// that have set no connection state go on the master's shared
// connections, the machinery above per master (clusterclient, shared.go): batched
// and in arrival order at each master (commands on different masters hold
// different keys, so each master's connections batch without waiting for
// the others'). Everything else goes on connections of the client's own,
// one per master, each a backend.Mux with one client
// (clusterclient, call.go): its commands are batched and its replies read by the
// same machinery (read only while replies are owed on it), and the
// forwarder reads no backend connection. Each
// reply takes a ticket in the client's cluster.Order and is put
// back in the client's order, however many masters a pipeline goes to.
// The multi-key commands that may cross slots are split per slot, keyless
// ones fanned out, and the replies of their parts merged by the reader
// that puts the last one in place; only RANDOMKEY and SORT with BY or GET
// patterns, which send more from what comes back, have the forwarder wait.
// Redirections (MOVED, ASK, TRYAGAIN) are followed on the same kind of
// connection, one after the other in the order they came, except inside
// a transaction. A later command for the same slot, routed by the same
// slot map, reaches the master that redirected the first, and when it is
// redirected too, it is followed behind it. Before a client's command
// goes on the other kind of connection, to its pub/sub connection, when
// it is routed by a newer slot map than the client's commands in flight
// or by no slot at all (the commands about the whole server or keyspace:
// DBSIZE, KEYS, SCAN, RANDOMKEY, FLUSHALL, INFO, FUNCTION, WAIT, ...;
// cluster.Client.keyless), as one of those in flight may be redirected to where
// it goes, or after a command that sets connection state or may block,
// the replies it is owed are waited for, so that Redis runs its commands
// in its order; a client owed none waits for nothing. WAIT goes to the
// master that ran the client's last command with keys in one slot, where
// a redirection sent it, on a connection of the client's own (WAIT
// below). One reordering is left: a command the cluster
// answers TRYAGAIN (a multi-key command whose keys a migration has split
// between two masters) is sent again after a pause, and a later command
// of the same pipeline on a key the old master still holds has run there
// before it. clusterclient's tx.go ties a
// transaction or WATCH to the connection it was sent on. A client that
// subscribes is pinned to one connection of its own to one node, served
// by the single-Redis rules above on a connection of one
// (clusterpubsub.go): the master of
// slot 0 for SUBSCRIBE and PSUBSCRIBE (the cluster broadcasts PUBLISH),
// that of the channels' slot for SSUBSCRIBE. MONITOR opens a connection
// of the client's own to every master and copies their lines
// (clusterclient, monitor.go). The commands about the whole server are applied
// to, or merged from, every master (internal/cluster, fan.go), and the set,
// sorted-set, LCS and PFCOUNT reads of keys in several slots, and SORT
// with BY/GET patterns, are computed by the proxy from each key's value
// (internal/cluster: join.go, lcs.go, hll.go, sort.go).
//
// Who reads a client. A client is read by the proxy's reading loop
// (loop.go) while it sends only commands that share a backend connection
// (in front of a cluster: with their keys in one slot): one goroutine, woken by Go's poller on the arrival
// order's epoll instance, reads every socket that has data in the order
// its data came, checks and cuts out the requests in place, forwards
// them as the client's goroutine would (in front of one Redis, a read's
// consecutive plain commands as one run: Mux.QueueRun), and writes each
// shared connection's batch once per turn: at once when nothing is in
// flight on it, when 64 commands or more wait, or when fewer than 64 are
// in flight to a Redis that answers from another CPU (the backend, not a
// cluster master); otherwise the
// connection's reader writes it with what comes meanwhile, once the
// replies in flight have been handed out (Mux.FlushTurn). The sockets of this path are
// read and written through internal/rawio, unseen by Go's scheduler. The client's first other request
// (a lock command, MULTI, SELECT, SUBSCRIBE, a blocking command, a
// protocol error ...) hands it, with the rest of that read, to its own
// goroutine, which redcon started and which waited in clientConn.Read
// until then, for good. Every other client (over TLS, with an idle
// timeout, signing in at the proxy) is read by its goroutine from the
// start. Both kinds of reads are numbered in one arrival order.
//
// Every request is framed as Redis 7.0 frames it and checked against the
// configured limits before redcon parses it (internal/resp, Scanner): what Redis skips
// (an empty line, a count of zero or less) is skipped, inline requests are
// split by Redis's quoting rules, a malformed request gets Redis's own
// error and a closed connection, and a declared but unsent length costs
// nothing.
//
// Layout. proxy.go has the Proxy, its Config and the accept and close
// callbacks. A client connection is a session, made of parts that each own
// their state:
//   - session.go: the session itself, which handles each command in order:
//     forwards it (forward), or answers it locally (answer, runLocal), and
//     matches each frame its connection of one reads against its fifo
//     (Frame), or relays the replication stream (relay). It is what the
//     multiplexed connections hand its replies to (backend.Client,
//     backend.Owner).
//   - queue.go: replyQueue, what the client is owed, in order: the fifo of
//     forwarded commands and the local command running, with the commands
//     held back behind it. Whoever must keep its place waits on its methods.
//   - state.go: connState, the connection-state machine (transaction,
//     CLIENT REPLY, protocol, subscriptions, MONITOR, replication, what to
//     replay). It sees every command sent and every reply frame; it has no
//     locks, the replyQueue drives it under its own. What a client set
//     that every connection replays (clientState) is learned there, by
//     one Redis's connState and a cluster client's session (clusterState)
//     alike.
//   - writer.go: clientWriter, the client's socket: buffered replies, the
//     sink the shared readers fill, and the non-blocking write path.
//
// upstream.go is where a session's commands go (the interface and its
// single-Redis kind); internal/backend's Mux and internal/cluster's Order
// are the batching, in one place: every backend connection a client's
// commands go on (shared connections, and connections of one client) and
// the order of a cluster client's replies; batching.go is the proxy's side
// of it (what the connections share, how a shared one is dialled, the
// order across every group). The cluster*.go files are the session's side
// of a Redis Cluster, and route nothing: clusterhost.go makes the session
// the Host of its clusterclient.Client (the client's socket and order,
// the connection state it set, the dialing of its connections in that
// state) and is the cluster's upstream; clusterpubsub.go serves the
// client's pub/sub connection, pinned to one node, as a client of one
// Redis's; clusterspare.go keeps each master's spare connections.
// sentinel.go is the proxy's side of
// internal/sentinel, clientconn.go checks requests with internal/resp's
// Scanner and waits for the reading loop to hand its socket over, loop.go
// is the reading loop, internal/acl's Passwords answer AUTH against the proxy's
// password-only users, acl.go and aclsession.go are the
// session's side of Redis's ACL (its users' shared connections, which
// checks each command needs), internal/guard keeps forwarded commands
// off the lock state (guard.go has the proxy's side), command.go answers
// INFO lockproxy and COMMAND, and
// fenced.go answers FENCED in the client's order like the proxy's own
// commands: it checks the inner command against the backend's COMMAND
// table and keeps the session's FENCED connections in the client's
// state; internal/fenced runs the transaction. Files outside a part call
// its methods only.
//
// Below proxy, packages that know nothing of client sockets:
//   - internal/backend: a backend connection (Conn: Dial, with TLS;
//     Setup, the commands that bring it to a client's state; Call, the
//     proxy's own round trips; Role), the batching of every connection a
//     client's commands go on (Mux, in a Group: shared; NewOne, a client's
//     connection of one; NewOwn, a cluster client's own connection to a
//     master), which meets the session through backend.Client and
//     backend.Owner and the proxy through an Env, the Spares kept dialled for
//     clients that move to a connection of their own, the Backoff after
//     failed dials, and the Arrivals: the order in which the clients'
//     sockets received data (Linux), which each read waits for before
//     its commands go to the backend, and the reading loop's wait on
//     them and numbering of its reads (loop_linux.go).
//   - internal/rawio: the non-blocking socket reads and writes of the
//     forwarding path, made with system calls the Go scheduler does not
//     see so that its monitor thread stays asleep, and the Heartbeat that
//     bounds that sleep; whether a socket's write takes its bytes at once (Fits)
//     and whether its peer answers from another CPU (Apart).
//   - internal/sentinel: finds the backend through Redis Sentinel when
//     configured: its Follower tracks the primary and owns every backend
//     connection dialled to it, closing them all when the primary changes
//     (dial asks it for the address).
//   - internal/fenced: FENCED's transaction (Exec: WATCH and GET of the
//     fence record, then MULTI, the record's update, the command, EXEC;
//     redirections and a demoted primary followed), what a FENCED may run
//     (Plan, Refuses), the fence records' names (RecordKey) and the guard
//     that keeps forwarded commands off them (GuardSpec).
//   - internal/acl: the rule engine of Redis's ACL at the proxy: the
//     users the configuration defines (ParseUser; their rules on the lock
//     commands stay here, the others are installed on each node), their
//     sign-in, and the lock resources' checks with ACL DRYRUN on control
//     connections, cached (Engine.Verdict), in Redis's wording; and
//     the proxy's own password-only users, whose AUTH it answers
//     (Passwords).
//   - internal/guard: the key guard, which refuses the forwarded commands
//     that would reach the lock state when the backend is also a lock
//     node (Config.ProtectedPrefix).
//   - internal/resp: the codec (the request Scanner, CopyReply and the
//     ReplyInfo the forwarding reads, aggregate replies split and
//     joined, Encode) and the command table: one declarative table of
//     what the proxy asks about each Redis command (Lookup, Of, Stateless;
//     Effect, what it does to its connection), with the key positions
//     loaded once from the backend's COMMAND (Table, LookupSpec).
//   - internal/cluster: Redis Cluster planning. The Router keeps the slot
//     map and the COMMAND table; a Client (one per cluster client,
//     embedded in clusterclient.Client) plans each command into a Call of
//     parts, asking its host (cluster.Host) for the barriers and the state
//     it owns; the merges of the parts' replies are functions of the
//     replies (and of a fetch callback for SORT's patterns).
//   - internal/clusterclient: a client's side of a Redis Cluster. Its
//     Router has the masters' shared connections by access generation;
//     a Client per cluster client sends what internal/cluster plans, on
//     those or on connections of its own (Route, Settle), follows the
//     redirections, ties transactions and WATCH to their connections, and
//     serves MONITOR, the keyspace mirrors, CLIENT TRACKING and UNBLOCK
//     and SCAN across the masters, asking the session (Host) for the rest.
//
// Lock order (also on clientWriter): backend.Mux's mu before
// replyQueue.mu; clientWriter.mu before clientWriter.sinkMu; replyQueue.mu
// is never held with a clientWriter lock, nor a writer lock with a Mux's;
// cluster.Order's lock is taken with none of these held and takes
// only clientWriter.sinkMu; clusterclient.Client's mu, redirMu and
// cluster.Client's movedMu are leaves, as are aclState's lock (acl.go)
// and acl.Engine's;
// sentinel.Follower's mu
// is a leaf, taken under any of them and holding none.
package proxy
