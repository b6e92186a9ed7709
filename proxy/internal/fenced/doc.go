// Package fenced runs FENCED's transactions on a backend: the check of a
// fence against the resource's fence record, the record's update and the
// command, as one WATCH/MULTI/EXEC transaction on a connection of the
// proxy's own (Exec), and what a FENCED may run and which keys it names
// (Plan, RecordKey, GuardSpec). The session that answers a client's
// FENCED (proxy/fenced.go) brings the connection to the client's state,
// checks the request against the backend's COMMAND table and hands a Plan
// here, with an Env: how to reach a node, and the cluster's Router when
// there is one. docs/FENCED.md describes the command.
//
// FENCED resource fence [PERMIT slot] command [arg ...] runs command on the
// backend only when fence is not below the resource's fence record, a key
// of the proxy's in the database (and, in front of a cluster, the hash
// slot) the command runs in. A write raises the record to fence, a read
// only checks it.
//
// How: the check, the record's update and the command are one
// optimistic transaction on a backend connection of the proxy's own,
// brought to the client's state (user, protocol, database, name):
//
//	WATCH record; GET record            (one round trip)
//	MULTI; SET record fence; command; EXEC   (a second one)
//
// or UNWATCH after a GET that shows a larger record (-STALEFENCE). EXEC's
// null reply (the record changed after WATCH) sends it all again. The
// command's reply is the element of EXEC's reply that answers it, which
// Redis encodes exactly as it would answer the command alone, in the
// connection's protocol: no reply is converted, unlike a Lua script's
// (RESP3 maps reordered, arrays cut at a nil, integers past 2^53
// rounded, EVAL and FCALL impossible inside a script). The client's own
// connection never sees WATCH, MULTI or EXEC, so its own WATCH and
// transaction state stay as they are. docs/PROTOCOL.md argues the choice.
package fenced
