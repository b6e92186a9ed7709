// Package rawio reads and writes sockets that never block (Go's network
// sockets are non-blocking) with system calls the Go scheduler does not
// see, for the forwarding path.
//
// Why. A goroutine's system call through package syscall tells the
// scheduler it entered one, and the scheduler wakes its monitor thread
// (sysmon) if that thread sleeps. The monitor sleeps for good whenever it
// finds every thread of Go code idle, which a proxy with one thread
// (gomaxprocs) and a loaded backend is between two batches of replies;
// woken, it polls every 20 µs for a millisecond before it may sleep
// again, takes the thread away from system calls that last past a poll,
// and hands it to another OS thread. Measured in front of one Redis
// (redis-benchmark -c 50 -P 1), that cost 0.06 sleeps, 0.06 futex calls and
// 0.17 context switches per forwarded command, and, in an A/B against the
// same build with the monitor kept from that sleep (GODEBUG=schedtrace),
// a quarter of the proxy's CPU. A read or write of a non-blocking socket returns at once, so the
// forwarding path makes them here, unseen, and the monitor sleeps on.
//
// Every function here must only be given descriptors in non-blocking
// mode; they return EAGAIN where a blocking call would wait.
//
// Two more questions about a socket, for the reading loop's early writes
// (backend.Mux.FlushTurn), are asked here for the same reason: Fits,
// whether a write takes its bytes without waiting (at most half the send
// buffer less what waits in it, asked of the kernel only when a bound
// kept from the writes leaves too little room), and Apart, whether the
// last bytes that came were received on another CPU than the caller's
// (on loopback: whether the peer runs on another CPU).
package rawio
