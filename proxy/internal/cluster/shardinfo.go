package cluster

import (
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// PUBSUB SHARDCHANNELS and SHARDNUMSUB in front of a Redis Cluster. A
// client's SSUBSCRIBE pins it to the master of its channels' slot, so the
// shard channels subscribed through the proxy are spread over the masters,
// and each master knows only its own: the proxy asks every master and
// merges, as one Redis holding all the subscriptions would answer. (PUBSUB
// CHANNELS, NUMSUB and NUMPAT stay the slot-0 master's, where every
// SUBSCRIBE through the proxy goes.)

// shardPubsub routes PUBSUB SHARDCHANNELS (the masters' lists, one after
// the other) and SHARDNUMSUB (each channel's counts summed); it reports
// false for the other PUBSUB subcommands.
func shardPubsub(m *SlotMap, sub string, raw []byte) (Call, bool) {
	switch sub {
	case "shardchannels":
		return Fan(m, raw, OpConcat), true
	case "shardnumsub":
		c := Fan(m, raw, OpFirst)
		c.Fold = func(replies [][]byte) ([]byte, bool) {
			return allOK(replies, func() []byte { return sumNumsub(replies) })
		}
		return c, true
	}
	return Call{}, false
}

// sumNumsub merges the masters' SHARDNUMSUB replies (channel, count, ...,
// an array, or a map in RESP3): the first master's, each count the sum of
// the masters' counts for its channel.
func sumNumsub(replies [][]byte) []byte {
	first, err := scalars(nil, replies[0])
	if err != nil {
		return resp.ErrorReply(err)
	}
	sums := make([]int64, len(first)/2)
	for _, r := range replies {
		vals, err := scalars(nil, r)
		if err != nil {
			return resp.ErrorReply(err)
		}
		for i := 1; i < len(vals) && i/2 < len(sums); i += 2 {
			n, _ := strconv.ParseInt(string(vals[i]), 10, 64)
			sums[i/2] += n
		}
	}
	var b []byte
	if replies[0][0] == '%' {
		b = append(b, '%')
		b = strconv.AppendInt(b, int64(len(sums)), 10)
		b = append(b, '\r', '\n')
	} else {
		b = redcon.AppendArray(b, 2*len(sums))
	}
	for i, n := range sums {
		b = redcon.AppendBulk(b, first[2*i])
		b = redcon.AppendInt(b, n)
	}
	return b
}
