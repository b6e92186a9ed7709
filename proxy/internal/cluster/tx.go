package cluster

import "sync/atomic"

// pin is a master and slot a transaction or WATCH is tied to.
type Pin struct {
	Addr string
	Slot int // noSlot until a command with keys chose it
	// conn is the connection a WATCH (or the transaction's MULTI) went
	// on (the proxy's, compared only); lost, that a WATCH went on another
	// one before, or that the transaction's connection was lost.
	Conn any
	Lost bool
}

// txnState is an open MULTI: where it is queued, the keyless commands
// queued before the first key chose the master (sent again there), and
// whether a command was refused (EXEC then aborts).
type TxnState struct {
	Pin
	// Held: the proxy answered the MULTI itself and has not sent it; it
	// goes with the transaction's first command, to the master that
	// command chooses, so that a transaction whose first command has keys
	// opens where it runs (one MULTI in that master's command stats and
	// MONITOR, none elsewhere), as on one Redis.
	Held  bool
	Multi []byte // the client's MULTI, as it sent it, while Held
	Early [][]byte
	// failed is set by the forwarder, or by the reader that makes the
	// reply of the call moving the transaction (inTxn's learn).
	Failed atomic.Bool
	// watched is the client's WATCH when MULTI came; watchLost, that the
	// MULTI went on another connection than it (the proxy's clustertx.go).
	Watched   *Pin
	WatchLost bool
}

// txRole is what a part does to the transaction or WATCH it belongs to.
type txRole uint8

const (
	TxQueued  txRole = iota // a command queued in the transaction
	TxOpens                 // the MULTI that opens the transaction on its connection
	TxExec                  // the transaction's EXEC
	TxDiscard               // the transaction's DISCARD
	TxMulti                 // a MULTI inside it: Redis refuses it and queues nothing
	TxWatch                 // a WATCH inside it: the same
)

// txPart is what a part of a transaction or WATCH carries: the transaction
// or WATCH, and, once it is sent or refused, what the client gets instead
// of the part's reply (nil: the reply).
type TxPart struct {
	Txn   *TxnState
	Watch *Pin
	Role  txRole
	Reply []byte
}
