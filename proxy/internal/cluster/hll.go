package cluster

import (
	"math"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// PFCOUNT of keys in several slots, in front of a Redis Cluster: each
// HyperLogLog is read (GET) on its master, the proxy merges their
// registers (the largest of each) and estimates the cardinality of the
// union as Redis 7.0 does for several keys (hllCount on the merged
// registers: Otmar Ertl's estimator, "New cardinality estimation
// algorithms for HyperLogLog sketches", arXiv:1702.01284), so the count
// is Redis's. Not one snapshot: the keys are read one after the other.

const (
	hllRegisters = 1 << 14 // HLL_REGISTERS: 2^14
	hllQ         = 64 - 14 // the bits of the hash left for the run of zeros
	hllHeader    = 16      // "HYLL", encoding, 3 unused, 8 bytes of cached count
	hllDenseSize = hllHeader + (hllRegisters*6+7)/8
	hllAlphaInf  = 0.721347520444481703680 // 1 / (2 ln 2)
)

var (
	replyNotHLL     = []byte("-WRONGTYPE Key is not a valid HyperLogLog string value.\r\n")
	replyCorruptHLL = []byte("-INVALIDOBJ Corrupted HLL object detected\r\n")
)

// pfcountCall plans PFCOUNT key key ...
func pfcountCall(m *SlotMap, args [][]byte) Call {
	c := Call{Kind: CallMerge}
	for _, k := range args[1:] {
		sl := KeySlot(k)
		c.Parts = append(c.Parts, Part{Slot: sl, Addr: m.Master(sl), Raw: command3("GET", k)})
	}
	c.Fold = func(replies [][]byte) ([]byte, bool) {
		var regs [hllRegisters]uint8
		for _, r := range replies {
			if IsError(r) {
				return r, true
			}
			v, err := scalars(nil, r)
			if err != nil {
				return resp.ErrorReply(err), true
			}
			if len(v) == 0 {
				continue // a missing key counts nothing
			}
			if reply := hllMerge(&regs, v[0]); reply != nil {
				return reply, true
			}
		}
		return redcon.AppendInt(nil, hllCount(&regs)), false
	}
	return c
}

// hllMerge folds one HyperLogLog value into regs, or returns Redis's
// error for a value that is not one.
func hllMerge(regs *[hllRegisters]uint8, v []byte) []byte {
	if len(v) < hllHeader || string(v[:4]) != "HYLL" || v[4] > 1 || (v[4] == 0 && len(v) != hllDenseSize) {
		return replyNotHLL
	}
	p := v[hllHeader:]
	if v[4] == 0 { // dense: 6 bits a register, least significant first
		for i := range hllRegisters {
			bit := i * 6
			b, shift := bit/8, uint(bit%8)
			x := uint(p[b]) >> shift
			if b+1 < len(p) {
				x |= uint(p[b+1]) << (8 - shift)
			}
			regs[i] = max(regs[i], uint8(x&63))
		}
		return nil
	}
	// Sparse: runs of zeros (ZERO: 00xxxxxx, XZERO: 01xxxxxx yyyyyyyy)
	// and runs of one value (VAL: 1vvvvvxx).
	idx := 0
	for i := 0; i < len(p); {
		op := p[i]
		switch {
		case op&0xc0 == 0:
			idx += int(op&0x3f) + 1
			i++
		case op&0xc0 == 0x40:
			if i+1 >= len(p) {
				return replyCorruptHLL
			}
			idx += (int(op&0x3f)<<8 | int(p[i+1])) + 1
			i += 2
		default:
			n, val := int(op&0x3)+1, uint8((op>>2)&0x1f)+1
			if idx+n > hllRegisters {
				return replyCorruptHLL
			}
			for k := idx; k < idx+n; k++ {
				regs[k] = max(regs[k], val)
			}
			idx += n
			i++
		}
		if idx > hllRegisters {
			return replyCorruptHLL
		}
	}
	if idx != hllRegisters {
		return replyCorruptHLL
	}
	return nil
}

// hllCount estimates the cardinality of the registers as Redis's
// hllCount does, in the same order of floating-point operations.
func hllCount(regs *[hllRegisters]uint8) int64 {
	var histo [64]int
	for _, r := range regs {
		histo[r&63]++
	}
	m := float64(hllRegisters)
	z := m * hllTau((m-float64(histo[hllQ+1]))/m)
	for j := hllQ; j >= 1; j-- {
		z += float64(histo[j])
		z *= 0.5
	}
	z += m * hllSigma(float64(histo[0])/m)
	return int64(math.Round(hllAlphaInf * m * m / z))
}

// hllSigma is σ(x) = x + Σ_{k≥1} x^(2^k) 2^(k-1), summed until it stops
// changing.
func hllSigma(x float64) float64 {
	if x == 1 {
		return math.Inf(1)
	}
	y, z := 1.0, x
	for {
		x *= x
		prev := z
		z += x * y
		y += y
		if z == prev {
			return z
		}
	}
}

// hllTau is τ(x) = (1 - x - Σ_{k≥1} (1 - x^(2^-k))² 2^-k) / 3, summed until
// it stops changing.
func hllTau(x float64) float64 {
	if x == 0 || x == 1 {
		return 0
	}
	y, z := 1.0, 1-x
	for {
		x = math.Sqrt(x)
		prev := z
		y *= 0.5
		z -= math.Pow(1-x, 2) * y
		if z == prev {
			return z / 3
		}
	}
}
