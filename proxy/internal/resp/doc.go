// Package resp is what the proxy knows of the Redis protocol and of Redis
// commands, with no knowledge of clients or connections:
//
//   - scan.go: Scanner, which frames a client's request stream as Redis
//     does and checks it against the request limits before redcon parses
//     it;
//   - reply.go: CopyReply, which copies one reply from a backend to a
//     client byte for byte, and ReplyInfo, what the forwarding needs to
//     know of it; aggregate.go splits and joins aggregate replies;
//   - table.go and keys.go: the command table, one place that answers
//     every question the proxy asks about a command (whether it may share
//     a connection, blocks, waits, subscribes, sets state every connection
//     carries, is about the whole server, how it splits across slots), a
//     static overlay, and where its keys are, loaded once from the
//     backend's COMMAND reply (Table).
package resp
