package cluster

import (
	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// The slow log in front of a Redis Cluster. A command the proxy applies
// to every master (CONFIG SET, SLOWLOG RESET, FLUSHALL, ...) is logged by
// each of them, so the masters' logs together would hold one copy per
// master of what one Redis logs once. The merged SLOWLOG GET and SLOWLOG
// LEN keep the first master's entry of such a command (the slot-0 master,
// which every fanned command reaches first) and leave out the other
// masters' copies. The other masters' logs are read whole (SLOWLOG GET -1,
// at most slowlog-max-len entries each), so that leaving copies out does
// not leave out older entries of theirs that belong among the newest.

// cmdSlowlogAll reads a master's whole slow log.
var cmdSlowlogAll = []byte("*3\r\n$7\r\nSLOWLOG\r\n$3\r\nGET\r\n$2\r\n-1\r\n")

// slowlogParts sends the client's SLOWLOG command to the first master of
// c, and SLOWLOG GET -1 to the others.
func slowlogParts(c *Call) {
	for i := 1; i < len(c.Parts); i++ {
		c.Parts[i].Raw = cmdSlowlogAll
	}
}

// slowlogLen answers SLOWLOG LEN from the first master's LEN and the
// other masters' entries that are not copies.
func slowlogLen(replies [][]byte) []byte {
	n, _ := leadingInt(replies[0])
	for _, r := range replies[1:] {
		entries, err := slowlogEntries(r, true)
		if err != nil {
			return resp.ErrorReply(err)
		}
		n += int64(len(entries))
	}
	return redcon.AppendInt(nil, n)
}

// slowlogEntries splits a SLOWLOG GET reply into its entries; with
// dropCopies, the entries of the commands the proxy applies to every
// master are left out.
func slowlogEntries(r []byte, dropCopies bool) ([][]byte, error) {
	n, elems, err := elements(r)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for range n {
		k, err := valueLen(elems)
		if err != nil {
			return nil, err
		}
		if !dropCopies || !fannedEntry(elems[:k]) {
			out = append(out, elems[:k])
		}
		elems = elems[k:]
	}
	return out, nil
}

// fannedEntry reports whether a slow log entry (id, time, duration,
// arguments, ...) is of a command the proxy sends to every master.
func fannedEntry(e []byte) bool {
	_, b, err := elements(e)
	if err != nil {
		return false
	}
	for range 3 { // id, time, duration
		k, err := valueLen(b)
		if err != nil {
			return false
		}
		b = b[k:]
	}
	_, b, err = elements(b)
	if err != nil {
		return false
	}
	args, err := scalarsUpTo(b, 2)
	if err != nil || len(args) == 0 {
		return false
	}
	var nb [24]byte
	return resp.Of(resp.Lower(&nb, args[0]), args).Has(resp.Fanned)
}

// scalarsUpTo reads at most n scalars at the start of b.
func scalarsUpTo(b []byte, n int) ([][]byte, error) {
	var out [][]byte
	for len(out) < n && len(b) > 0 {
		var err error
		if out, b, err = scalarsAt(out, b); err != nil {
			return out, err
		}
	}
	return out, nil
}
