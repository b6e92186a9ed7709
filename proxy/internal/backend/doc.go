// Package backend holds what lies between a client session and the
// backend Redis and knows nothing of the session:
//
//   - Conn, one connection to a backend Redis: Dial opens it (TCP or a
//     unix socket, with TLS when configured), Setup brings it to a
//     client's state (AUTH, HELLO, SELECT, CLIENT SETNAME ...) and tells
//     a refusal (RefusedError) from a lost connection, Call and Role are
//     the proxy's own round trips on it, and Open tells whether an idle
//     one is still open. Clients' commands are written and their replies
//     read by the proxy's batching, which owns the Conn then.
//   - Mux and Group, the batching of every connection a client's commands
//     go on: a Group of shared connections to one server, whose commands
//     of many clients leave in one write, in the order they came across
//     the group, and whose replies are handed back in order to the Client
//     each answers; a client's connection of one (NewOne), whose frames
//     its Owner matches; a cluster client's own connection to a master
//     (NewOwn), read only while replies are owed on it. What the
//     connections share across the proxy (the batch count, the counters,
//     the hooks) is an Env.
//   - Spares, a few connections kept dialled and set up, so that a client
//     that moves to a connection of its own costs no dial on its request
//     path (a dial there would let a command another client sends right
//     after reach Redis first).
//   - Backoff, which spaces out the dials to a backend that is down.
//   - Arrivals (Linux): the order in which the clients' sockets received
//     data, which each read waits for before its commands go on, so that
//     the commands of different clients reach Redis in the order Redis
//     itself would have read them.
package backend
