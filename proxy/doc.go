// Package proxy is the Redis endpoint of lockproxy: it owns the client
// connections, answers the proxy's own commands through a Local per
// connection, and forwards every other command to the backend Redis as raw
// RESP, copying the backend's replies back byte for byte.
//
// Connection model: the stateless commands of clients that have set no
// connection state go over a few shared backend connections (shared.go):
// commands of many clients leave in one write and each reply is routed
// back to its client. At its first command that sets or reads connection
// state, or blocks, a client moves to a dedicated backend connection, so
// everything a client can set on a Redis connection (SELECT, AUTH, HELLO 3,
// CLIENT SETNAME, MULTI, WATCH, subscriptions, MONITOR, blocking commands)
// stays the client's own. A pipeline read from the client in one go is
// written to the backend in one go. A fifo of the commands in flight keeps
// the proxy's own replies in their place in the stream, and recognises
// pub/sub and MONITOR traffic that answers no request. session.forward is
// where a command's connection is chosen.
//
// When the backend connection breaks, the commands waiting on it are
// answered with "-ERR backend unavailable: ...", and the next command opens
// a new connection brought back to the client's state (AUTH, HELLO, CLIENT
// SETNAME, SELECT). A client that was subscribed or monitoring is
// disconnected instead, so that it notices its subscriptions are gone.
//
// Every request is framed as Redis 7.0 frames it and checked against the
// configured limits before redcon parses it (limits.go): what Redis skips
// (an empty line, a count of zero or less) is skipped, inline requests are
// split by Redis's quoting rules, a malformed request gets Redis's own
// error and a closed connection, and a declared but unsent length costs
// nothing.
package proxy
