// Package clusterclient is a client's side of a Redis Cluster at the
// proxy: it sends what internal/cluster plans for each command and keeps
// the state a cluster client has beyond the connection state the session
// keeps. Where each command goes is decided by internal/cluster (the slot
// map, the plan of each command, the merges of the replies); a Client
// carries the parts it plans:
//
//   - route.go: Route hands each call to the batching of internal/backend
//     (Mux) and cluster.Order, on the masters' shared connections
//     (shared.go, Router) or the client's own (call.go); Settle is the
//     barrier before a command that must not pass the replies owed.
//   - shared.go: the shared connections per master and access
//     generation, and the redirections (MOVED, ASK, TRYAGAIN,
//     CLUSTERDOWN) followed for the client, within Config.Retry.
//   - call.go: the client's own connection to each master, the parts of
//     a call whose reply is merged, and the calls the forwarder waits for
//     (RANDOMKEY, SORT's patterns: ask).
//   - tx.go ties a transaction or WATCH to the connection it went on.
//   - monitor.go: MONITOR on every master; keyspace.go mirrors a pinned
//     client's keyspace notifications from every master; tracking.go is
//     CLIENT TRACKING (the masters' pushes in the stream of the client's
//     own connections; a REDIRECT target's sink per master, shared by
//     the clients that redirect to it); unblock.go CLIENT UNBLOCK;
//     scan.go fills SCAN's COUNT across the masters.
//   - host.go: Host, what a Client asks of the session it routes for (its
//     socket, its order outside the cluster's, the connection state the
//     client set, the dialing of its connections in that state), and the
//     Client as the host of its plans (cluster.Host).
//
// A reply that redirects or says the slot is not served yet is never the
// client's: the command is sent again where the cluster says. Lock order:
// a Client's mu and redirMu are leaves, as is cluster.Client's movedMu;
// cluster.Order's lock is taken with none of the session's held.
package clusterclient
