package quorum

import _ "embed"

// hashLua is the part of opsScript that handles hash records: the shared
// (RLOCK) and semaphore (LOCK ... PERMITS k, k > 1) holdings. It is spliced
// into opsScript after its common functions (now, held, get, parse, relies,
// addAttempt) and before the operations that use it, which reach it only in
// their slow branch: where the lock key turns out to be a hash (WRONGTYPE
// for GET). The exclusive fast path never calls it.
//
// The record at <prefix>lock:<resource> is a hash:
//
//	m            the mode while anything is held: "r" (shared) or "s<k>"
//	w            "1" once a waiter asked to be told of a release
//	i            a waiting writer's intent: its expiry on the node's clock;
//	             new readers wait while it lives (see shared.go)
//	@<token>     a reader's holding
//	#<slot>      a semaphore permit's holding, slot from 0 to k-1
//	x/<attempt>  a tombstone of a cleaned-up attempt: its expiry
//
// A holding's value is "<expiry>|<fence>/<attempts>:<token>", expiry being
// the node's clock in ms; the attempts are as in a lock's value. Expired
// holdings, intents and tombstones are pruned whenever the record is read,
// and the key's PX is the latest expiry in it, so the key vanishes with its
// last holding as a string lock does with its PX. A hash without a mode (an
// earlier layout's) reads as held by someone else until it expires.
//
// The slow branch of the exclusive operations answers, where they met a
// hash, with a pair {code, 0} for the mode rules (see modeCodes in
// shared.go): code k > 1 for a semaphore of k, -2 for shared, -3 for a
// token that holds the resource in the other mode (-DEADLOCK); the
// operations on a holding (release, extend, raise, cleanup) find the
// token's holding in the hash and act on it as on a string lock.
//
//go:embed lua/hash.lua
var hashLua string
