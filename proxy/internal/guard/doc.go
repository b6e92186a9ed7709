// Package guard keeps the commands a proxy forwards away from the lock
// state, when the backend Redis is also a lock node: a command whose keys
// start with the protected prefix (found where Redis itself says they
// are: the COMMAND table's positions, or COMMAND GETKEYS) is refused
// (Error), and so are the commands that wipe, move or copy every key.
package guard
