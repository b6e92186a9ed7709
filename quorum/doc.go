// Package quorum is lockproxy's lock engine: Redlock
// (https://redis.io/docs/latest/develop/use/patterns/distributed-locks/) across
// N independent Redis "lock nodes", with fencing tokens and FIFO waiting.
//
// A Locker acquires a resource by running one Lua script on every node in
// parallel, each call bounded by Config.NodeTimeout, and holds the lock when a
// majority (N/2+1) granted it and some validity is left: validity = ttl -
// elapsed - (ttl*DriftFactor + 2ms) - ClockTolerance, with elapsed measured
// on the monotonic clock. A failed acquisition releases whatever it got on every node. Unlock
// and Extend are compare-and-delete and compare-and-pexpire scripts that need a
// majority too. One node is a plain single-instance lock. An even N is allowed
// but tolerates no more failed nodes than N-1 does (4 nodes need 3).
//
// The calls of concurrent callers share round trips: each node has one
// goroutine that sends every call waiting for that node as one pipeline and
// runs them all in one script call, so a node reads, writes and enters Lua
// once for many callers (the scripts' Lua is in lua/, embedded by lua.go;
// scripts.go documents the key layout and every operation). Each call keeps its own
// deadline, and a batch that times out counts as a timeout of each call in
// it.
//
// Redlock's safety rests on assumptions worth knowing before relying on it.
// Nodes expire keys with their own clocks, so clocks must advance at about the
// same rate (DriftFactor is the allowance), and a long pause of the holder
// (GC, swap, a stopped VM) can let a lock expire while its holder still
// believes it holds it. Validity is the only
// guarantee: a holder must finish, or Extend, before it runs out. Because a
// paused holder cannot notice its own expiry, every Lock carries a fence, a
// number that grows strictly for successive holders of a resource; storage
// the lock protects should reject writes carrying a smaller fence than one it
// has seen (see Martin Kleppmann, "How to do distributed locking",
// https://martin.kleppmann.com/2016/02/08/how-to-do-distributed-locking.html).
// A node that restarts empty, is flushed or replaced forgets the locks it
// granted, and plain Redlock can then grant a lock twice. A Locker does not
// count such a node until it cannot have forgotten a live lock: every node
// of a deployment in use holds a marker that every call reports, and a node
// without it is brought back by copying the live locks from the other nodes,
// or counts again once Config.MaxTTL has passed since the loss. recovery.go
// gives the argument for safety and walks through the races. Extend puts a
// held lock back on nodes that lack it, and a lock won while a node still
// showed the previous holder is placed there later (place.go), so that
// locks do not rest on a bare majority. A request that reaches a node
// after its call gave up (TCP retransmits it after a partition heals, or a
// paused node runs it) does nothing that a later attempt, another owner or
// a later call with the same token could depend on: every operation
// carries its deadline on the node's clock and its attempt's id, and a
// failed attempt's cleanup removes only what that attempt alone relies on;
// late.go gives the argument. A keeper goroutine per node reads its clock
// and reconnects to it in the background (conn.go), so a node that answers
// again is used without spending calls on dials. A node that may evict keys (a
// memory limit with a policy other than noeviction) never counts, and one
// that did evict keys loses its marker and is recovered. A node whose wall
// clock jumps forward expires its locks early, which is the same loss: every
// call also reads the node's clock against a reference clock that the nodes
// keep (each its offset) and a majority of them defines, a vote counts only
// from a node in line with it, and a node found ahead loses its marker and is
// recovered the same way (clock.go gives the argument and its races). What
// stays out of reach: a majority of the nodes losing their data (or jumping
// their clocks) at once, a forward jump within ClockTolerance, and a node that
// keeps its marker but loses recent writes (persistence without appendfsync
// always, a promoted replica).
//
// MLock takes several resources all or nothing: one script operation per
// node over the whole set, which grants all of it or none, and a majority
// of nodes that granted all; each resource then is an ordinary lock of the
// token, with its own fence. A waiting MLock holds none of its resources
// (mlock.go).
//
// Waiters (Options.Wait) queue per resource in arrival order. When the
// holder's Unlock goes through the Locker where the first waiter waits
// between attempts, Unlock hands it the lock in its own round: each node
// releases the holder's lock and takes it for the waiter in one call, and
// the waiter holds it once a majority did and the fences are confirmed, as
// for any acquisition (handOver in lock.go). A plain waiter is answered as
// soon as a majority of counting nodes granted it with one fence, and the
// Unlock returns then too when it released the holder's lock on that
// majority; the other nodes' replies are dealt with in the background
// (handearly.go gives the argument). The waiter that becomes the
// head then knows the lock held and waits for the next Unlock without an
// attempt of its own, so a contended lock costs the nodes one call per
// acquisition. Otherwise waiters are woken by
// a release notification that Unlock publishes on "<prefix>released", which
// every Locker subscribes to on every node, so a waiter wakes about a round
// trip after the holder released, also when the holder used another Locker.
// A waiter's attempt marks the lock on the nodes where someone else holds
// it, and only a marked lock's release is published, so locks nobody waits
// for cost no messages.
//
// A reentrant holding (Options.Reentrant, Release) counts holds. The count
// is stored with the lock on the nodes as an absolute value with a
// version, never as per-node increments: every change reads the count a
// majority holds and writes the next version to every node, and no node
// deletes a counted lock on its own count (reentrant.go). The attempts of
// one reentrant call carry the call's id, so that none of them counts as
// an earlier hold what a failed attempt of the same call left on a node,
// whatever order its cleanup arrives in (reentrant.go gives the
// argument). Info reads what
// a majority of the nodes report of a resource for LOCKINFO (info.go);
// Locks lists the resources a majority holds for LOCKS (locks.go).
//
// All keys and channels start with Config.KeyPrefix: "<prefix>lock:<resource>"
// (a string with the holder's fence, attempts, hold count, holder and token, expiring with the
// lock, or a short-lived tombstone of a failed attempt),
// "<prefix>fence" (one counter per node), "<prefix>intact" (the marker),
// "<prefix>recovery", "<prefix>clock" (the node's clock offset) and
// "<prefix>released". State on the nodes therefore
// does not grow with the number of resources ever locked.
//
// RLock takes a shared (read) holding and Lock with Options.Permits k > 1
// one of k permits of a semaphore. Both live in a hash record at the same
// lock key, one field per reader or per slot (shared.go): an exclusive
// acquisition reads the hash as held, so readers and the writer exclude
// each other on every node and hence on any two majorities. A semaphore is
// k slots, each a mutex granted by a majority; semaphore.go argues that at
// most k hold at once under the same failures as the plain lock. A waiting
// writer records its intent in the record, which makes new readers wait.
//
// A Locker tracks whether each node's last call succeeded and whether it
// kept its data (Status, NodesUp, Ready for a readiness probe) and exports
// that, per-node errors and timeouts, losses and recoveries, and the wait
// and handoff times of waiters as Prometheus metrics (Locker.Collect).
package quorum
