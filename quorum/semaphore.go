package quorum

// Semaphores, and why at most k hold at once.
//
// Lock with Options.Permits k > 1 takes one of k permits of a resource.
// Counting holders on each node and granting on a majority does not bound
// them: with 3 nodes and k = 2, A can hold on nodes 1 and 2, B on 2 and 3,
// C on 1 and 3, every node showing two holders while three hold. So a
// semaphore is k mutexes, the slots 0..k-1, and a permit is one slot held
// exactly as the plain lock is held:
//
//   - On a node, slot s is the field "#s" of the resource's hash record
//     (hashLua), with its holder's token, fence, attempts and expiry on the
//     node's clock. The node grants slot s to a token only while no other
//     token holds it there (hacquire, one atomic script call): per node,
//     a slot has at most one live holder, as a string lock key has.
//   - A round proposes one slot s to every node; the permit is granted only
//     when a majority of the nodes that count granted that same s, its
//     fences were confirmed on a majority (confirm, as for Lock) and
//     validity is left. A round that loses undoes what it got on every node
//     (cleanup) and the next round proposes another slot: the one the
//     token holds already, or the one most nodes reported free.
//
// At most k. Two holdings of slot s live at the same time were each
// granted by a majority of counting nodes; two majorities share a node,
// which would have granted s to a second token while the first still held
// it there, and no node does. So each slot has at most one holder within
// validity, and the holders of a resource, each in its own slot, number at
// most k. The assumptions and the failures covered are the plain lock's,
// word for word, because every step is the plain lock's with "the key"
// read as "the field #s":
//
//   - A node that loses its data (restart, flush, replacement) or whose
//     clock jumps forward (a field's expiry is compared with the node's
//     clock, as PX is) does not count until it can no longer have
//     forgotten a live permit: its marker is gone, and recovery by copy or
//     by deadline applies as to any lock (recovery.go). A permit granted or
//     extended meanwhile was counted on a majority of intact nodes without
//     it.
//   - Late requests (late.go): every operation carries its deadline and
//     attempt; a cleanup takes only its attempt off the holding, and where
//     the token holds nothing it leaves a tombstone of the attempt (the
//     field "x/<attempt>", or the string tombstone where the key is free),
//     which makes the attempt's acquisition, arriving later, fail with
//     LATE. Creating or refreshing a field only makes a node refuse others
//     longer.
//   - The mode lives with the slots: "m" is "s<k>" while any slot is
//     held, a node refuses a semaphore of another k, a reader or a writer
//     in the same call, and a mode reply counts as "held" unless a majority
//     of counting nodes agrees on it (-LOCKMODE). Holders with different k
//     therefore never share a node, and two live majorities share one.
//
// Fences, per slot. Every grant of a slot on a node advances the node's one
// fence counter, and the permit's fence is confirmed on a majority as
// Lock's is, so the argument in Lock's comment holds for each slot: a
// later holder of slot s gets a larger fence than every earlier one whose
// holding ended before it began. (The counter is shared by all slots and
// modes, so fences in fact grow across slots too; storage that checks
// fences keeps the highest per slot, since holders of different slots hold
// at the same time.)
//
// What is not guaranteed, as for Lock: a majority of nodes losing their
// data at once, clocks that drift more than DriftFactor allows, and a
// holder that keeps using its permit past its validity.
