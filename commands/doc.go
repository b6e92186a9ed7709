// Package commands implements the proxy's own Redis commands, LOCK, UNLOCK
// and EXTEND, on top of the Redlock engine in package quorum.
//
// A Handler parses the arguments of one command the way Redis parses its own
// (case-insensitive names and options, times as integer milliseconds, Redis
// wording for errors), rejects bad arguments before any lock node is asked,
// calls the quorum.Locker and encodes the result as a RESP2 or RESP3 reply.
// Each client connection gets a Conn, which remembers the locks it acquired so
// that UNLOCK and EXTEND may leave out the token, and which owns the KEEPALIVE
// extenders: one goroutine per kept lock, extending it about every ttl/3
// (or half the validity left, if less) until UNLOCK or Close. The Handler counts the outcome of every command and
// the locks its open connections hold, as Prometheus metrics
// (Handler.Collect) and for INFO (Handler.Info).
//
// The commands are the rows of one table (specs, in table.go): name, arity,
// flags, docs, outcomes and handler. Names, Is, MayWait, the dispatch in
// Conn.Serve, COMMAND INFO and COMMAND DOCS (AppendCommandInfo,
// AppendCommandDocs), the metrics' labels and INFO all read it.
//
// The user-facing protocol, every reply and error of the three commands, is
// docs/PROTOCOL.md at the root of the repository. The package contains no
// algorithm of its own and does not know about network connections, which
// belong to package proxy.
package commands
