package quorum

// Requests that arrive late, and why none of them can break exclusion or
// leave a lock behind.
//
// A call gives up on a node after NodeTimeout, but what it sent is not
// lost: TCP retransmits into a link that drops packets and delivers once
// it heals; a node that is paused (SIGSTOP, a long fork, an overloaded
// host) has the request in its socket buffer and runs it when it resumes;
// a user-space relay forwards what it already read. So a request can run
// on a node long after its call ended, after a later attempt of the same
// waiter, after the holder's Unlock, or after another owner took the lock.
// Three mechanisms, each enough for part of the argument:
//
//   - Abort on close. Node connections close with SO_LINGER 0 (conn.go):
//     when go-redis drops a connection after a timeout, the kernel discards
//     whatever the node did not acknowledge instead of retransmitting it
//     after a heal. What the node's kernel already received (a paused node,
//     a cut of the replies only, a relay) is still delivered.
//   - Deadlines. Every operation carries its call's deadline on the node's
//     clock (deadlineOn; the keeper reads each node's clock): the Locker's
//     deadline, translated with a reading of the node's time taken before
//     the reply that carried it arrived, so it passes on the node no later
//     than the call's deadline passes here, drift aside. The script refuses
//     an operation whose deadline has passed (LATE), in the same atomic call
//     that would run it. Under clocks that run at about the same rate, no
//     operation runs after its call ended. A node's clock that jumps
//     forward only refuses more (the keeper reads it again at the first
//     LATE reply); one that jumps backward by J lets an operation sent
//     before the node's next reply run up to J late: every reply carries
//     the node's TIME, and one that reads less than the keeper's reading
//     allows replaces it at once (checkClock). No request that needs a
//     deadline is sent to a node whose clock was never read (a fresh
//     Locker, a node that never answered): the batcher reads the clock
//     first (firstReading), one round trip, once per node and Locker, and
//     while the node does not answer those requests fail without being
//     sent. A reading taken with a dial and a handshake is as good as any:
//     the node reads its clock last, so the reading lies early only by the
//     reply's way back (takeReading).
//   - Attempts. Every round has an attempt id, unique across Lockers. A
//     lock's value lists the attempts of its token that rely on it (the one
//     that took it, and any later attempt of the same token that refreshed
//     it: an idempotent retry, a waiter's next attempt finding its own
//     leftover). The cleanup of a failed attempt takes only its own id off
//     the list and deletes the lock only when the list is empty; where the
//     lock is free, it leaves a tombstone of the attempt (ttl ms), which
//     makes that attempt's acquisition, arriving afterwards, do nothing.
//     A reentrant call's later attempt replaces the call's earlier ids on
//     the list with its own (reentrant.go): those attempts failed, so
//     their cleanups, arriving afterwards, find nothing of theirs.
//     Cleanups carry no deadline: they are safe whenever they arrive, so a
//     cleanup that a node did not answer is sent again by the node's keeper
//     once the node answers (or only times out: a link slower than
//     NodeTimeout still carries it), until the attempt's ttl has passed;
//     a cleanup for a node that did not answer its last batch is left to
//     the keeper at once, rather than keep the failed call waiting for
//     the node's timeout. A request that the batcher failed without
//     sending it (reply.unsent) never reaches the node: its attempt is not
//     cleaned up there.
//
// Why the deadline is fixed before the request leaves, on the node's clock,
// and not given as a budget (the time the call had left) that the script
// would add to its TIME on arrival: a budget bounds the time a request may
// spend once it arrived, not the time before. A request held by TCP in a
// link that drops packets, in a paused node's socket buffer or in a relay
// arrives with its whole budget however late it is, and runs: exactly the
// requests of issue 30. A deadline on the node's clock passes on the node
// while the request is held, whatever holds it. It needs a reading of the
// node's clock, which is why the first request to a node waits for one: a
// round trip on a fresh Locker's first call, where the alternative (no
// deadline until the keeper's first reading) left that window unbounded.
//
// Exclusion breaks only if a lock that a granted holding counts on
// disappears or expires early on a node, or a node grants a lock that
// another holder still has there. A late request can create, extend,
// refresh or delete; creating and extending only ever make a node refuse
// others longer, which costs liveness, never exclusion. So what matters is
// what a late request deletes or shortens, case by case:
//
//   - Late acquire, late handoff, late place. Where the lock is free they
//     create one (liveness, see below); where another token holds it they
//     do nothing; where the same token holds it they refresh it: the ttl is
//     reset to the request's ttl from now, and the attempt joins the list.
//     A refresh shortens a lock only if the later holding set a longer ttl
//     than this request carries and has run less of it than the request is
//     late: the deadline rules that out except under a backward clock jump.
//     Joining the list never lets a cleanup delete the holding that
//     another attempt relies on. Against a tombstone of their own attempt
//     they do nothing.
//   - Late cleanup (of a failed or abandoned attempt). It deletes only a
//     lock that its attempt alone relies on. A later attempt of the same
//     token that counted the node refreshed the lock there first (it is
//     only counted after it ran), so it is on the list and the lock stays:
//     issue 30's double grant (an earlier attempt's cleanup deleting the
//     lock that the same waiter's later attempt won) cannot happen, with
//     any clocks. Elsewhere it writes a tombstone, which anyone but its
//     attempt overwrites.
//   - Late raise. It sets the stored fence only upward, and the counter is
//     a maximum: fences never go back.
//   - Late extend. It resets the ttl of the token's lock: as a refresh
//     above.
//   - Late release (Unlock, and the release half of a handoff). It deletes
//     the token's lock whatever its attempts, as Unlock must. It can hurt
//     only a later holding of the same token (the client reused a token
//     after unlocking it), and only by arriving after its deadline, which
//     the node refuses, except under a backward jump of the node's clock.
//   - Late init. It creates the marker only before its deadline, so a late
//     init cannot mark a node that lost its data since as intact.
//
// Nothing left behind. A request that ran in time on a node whose reply
// was lost or late leaves the attempt's lock there; the cleanup reaches the
// node at once, or, when the node did not answer it (or its last batch), as
// soon as the keeper reaches the node again (at most keepTimeout +
// maxKeepBackoff + a reconnection after the node answers; the keeper's
// dials race, so a link that heals is found within DialTimeout/5 of a
// try). A request that arrives after its
// cleanup finds the tombstone (free lock) or the lock of others and does
// nothing; one that arrives after its deadline does nothing. So a resource
// that a NOQUORUM left is free again as soon as its nodes answer and the
// cleanups ran; at the latest, with clocks that jumped backward, when the
// attempt's ttl ends, as before. The same holds for every failed attempt
// of a waiter. What a lock list cannot undo: a lock that more than eight
// attempts of one token relied on ('*') waits for the holder's Unlock or
// its ttl.
//
// The bound a test can check (partition_test.go): after a partition that
// turned a LOCK into NOQUORUM heals, the resource is free within one call;
// with requests retransmitted by TCP after the heal, it stays free.
