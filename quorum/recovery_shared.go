package quorum

import (
	_ "embed"
	"slices"
	"strconv"
	"strings"
)

// Recovery by copy of hash records (shared holdings and semaphore permits
// are live lock state, see recovery.go and shared.go).
//
// dumpScript and peekScript read a hash record as one value, "H" followed
// by netstrings ("<len>:<bytes>"): the mode, then per live holding its
// field, the ms it has left on the source's clock, and the rest of its
// value ("<fence>/<attempts>:<token>"). Times left, not expiries, because
// the nodes' clocks differ. Readings of one record from several sources
// merge per field as lock values do: the same token keeps the larger fence,
// the longer time and the attempts of both; different tokens in one field
// (a slot whose holder the sources disagree on) become a holding that no
// token owns ("" as the token) for the longer time, so that the node
// refuses that slot to everyone while either may hold it. Records in
// different modes, or a record against a string lock, become a lock that
// no token owns, as two owners of a string lock do. Holdings stored with a
// fence above the source's counter at the first read are left out, as
// locks are (written since, by an acquisition that never counted the
// recovering node). restoreScript writes a record's holdings with
// expiries of the time left from the node's own clock, keeping, for a
// holding of the same token already there, the larger fence, the later
// expiry and the attempts of both.

// hdumpLua is spliced into dumpScript and peekScript: hdump(key) reads the
// hash record at key as one value: "" for a hash without a mode (held by
// no token), "x" when nothing in it lives (no lock), else "H...".
//
//go:embed lua/hdump.lua
var hdumpLua string

// hrestoreLua is spliced into restoreScript after its union function:
// hrestore(key, v) writes the hash record v (hdump's) onto key and returns
// a table, so that the caller skips its string-lock path.
//
//go:embed lua/hrestore.lua
var hrestoreLua string

// hashHold is one holding of a copied hash record.
type hashHold struct {
	field string
	left  int64 // ms
	fence int64
	att   string
	token string
}

// isHashCopy reports whether v is a copied hash record.
func isHashCopy(v string) bool { return len(v) > 0 && v[0] == 'H' }

// decodeHash parses a copied hash record.
func decodeHash(v string) (mode string, holds []hashHold, ok bool) {
	if !isHashCopy(v) {
		return "", nil, false
	}
	rest := v[1:]
	take := func() (string, bool) {
		n, after, found := strings.Cut(rest, ":")
		l, err := strconv.Atoi(n)
		if !found || err != nil || l < 0 || l > len(after) {
			return "", false
		}
		s := after[:l]
		rest = after[l:]
		return s, true
	}
	if mode, ok = take(); !ok {
		return "", nil, false
	}
	for rest != "" {
		f, ok1 := take()
		left, ok2 := take()
		val, ok3 := take()
		ms, err := strconv.ParseInt(left, 10, 64)
		token, fence, ok4 := splitLock("0" + val)
		if !ok1 || !ok2 || !ok3 || !ok4 || err != nil {
			return "", nil, false
		}
		holds = append(holds, hashHold{field: f, left: ms, fence: fence, att: lockAttempts("0" + val), token: token})
	}
	return mode, holds, true
}

// encodeHash is the inverse of decodeHash.
func encodeHash(mode string, holds []hashHold) string {
	var b strings.Builder
	ns := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	b.WriteByte('H')
	ns(mode)
	for _, h := range holds {
		ns(h.field)
		ns(strconv.FormatInt(h.left, 10))
		ns(strconv.FormatInt(h.fence, 10) + "/" + h.att + ":" + h.token)
	}
	return b.String()
}

// readingHash is reading for a copied hash record: holdings stored with a
// fence above counter are left out, and a record left with none is no
// lock. A record that does not parse is held by no token.
func readingHash(val string, pttl, counter int64) (copied, bool) {
	mode, holds, ok := decodeHash(val)
	if !ok {
		return copied{value: "0", pttl: pttl}, true
	}
	holds = slices.DeleteFunc(holds, func(h hashHold) bool { return h.fence > counter })
	if len(holds) == 0 {
		return copied{}, false
	}
	return copied{value: encodeHash(mode, holds), pttl: pttl}, true
}

// mergeHash is merge where a or b is a copied hash record.
func mergeHash(a, b copied) copied {
	ma, ha, oka := decodeHash(a.value)
	mb, hb, okb := decodeHash(b.value)
	p := longer(a.pttl, b.pttl)
	if !oka || !okb || ma != mb || !isHashCopy(a.value) || !isHashCopy(b.value) {
		var fence int64
		for _, h := range append(ha, hb...) {
			fence = max(fence, h.fence)
		}
		for _, v := range []string{a.value, b.value} {
			if !isHashCopy(v) {
				_, f, _ := splitLock(v)
				fence = max(fence, f)
			}
		}
		return copied{value: "0" + strconv.FormatInt(fence, 10), pttl: p}
	}
	for _, h := range hb {
		i := slices.IndexFunc(ha, func(x hashHold) bool { return x.field == h.field })
		if i < 0 {
			ha = append(ha, h)
			continue
		}
		x := &ha[i]
		if x.token != h.token {
			x.token, x.att = "", "*" // disputed: no token owns it
		} else {
			x.att = unionAttempts(x.att, h.att)
		}
		x.fence, x.left = max(x.fence, h.fence), max(x.left, h.left)
	}
	slices.SortFunc(ha, func(x, y hashHold) int { return strings.Compare(x.field, y.field) })
	return copied{value: encodeHash(ma, ha), pttl: p}
}

// undisputed reports whether the copy v names its owners: a lock value of
// one token, or a hash record.
func undisputed(v string) bool {
	_, _, ok := splitLock(v)
	return ok || isHashCopy(v)
}
