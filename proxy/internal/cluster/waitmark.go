package cluster

import (
	"fmt"
	"sync"
)

// waitMarkScript writes KEYS[1] and deletes it at once, unless it exists:
// the connection it runs on then has the primary's replication offset as
// that of its last write (what WAIT and WAITAOF wait for), and no key
// changes. No command sees the key, as a script runs alone; but the write
// shows where writes show: BCAST tracking invalidations, keyspace
// notifications, MONITOR (see README).
const waitMarkScript = "if redis.call('set',KEYS[1],'1','nx') then redis.call('del',KEYS[1]) end return 0"

// waitMarkKey is the key waitMarkScript writes, in front of one Redis.
const WaitMarkKey = "lockproxy:wait-mark"

// waitMarks caches waitMark's commands by slot.
var waitMarks sync.Map // int -> []byte

// waitMark returns the command that runs waitMarkScript on a key of
// waitMarkKey's with a hash tag in slot: the first that hashes there,
// found once per slot (about numSlots checksums).
func WaitMark(slot int) []byte {
	if raw, ok := waitMarks.Load(slot); ok {
		return raw.([]byte)
	}
	var key []byte
	for n := 0; ; n++ {
		key = fmt.Appendf(key[:0], "%s{%d}", WaitMarkKey, n)
		if KeySlot(key) == slot {
			break
		}
	}
	raw := WaitMarkCommand(string(key))
	waitMarks.Store(slot, raw)
	return raw
}

// waitMarkCommand is the RESP command that runs waitMarkScript on key.
func WaitMarkCommand(key string) []byte {
	return fmt.Appendf(nil, "*4\r\n$4\r\nEVAL\r\n$%d\r\n%s\r\n$1\r\n1\r\n$%d\r\n%s\r\n",
		len(waitMarkScript), waitMarkScript, len(key), key)
}
