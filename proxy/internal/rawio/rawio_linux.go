//go:build linux

package rawio

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read reads into b from fd, retrying on EINTR.
func Read(fd uintptr, b []byte) (int, syscall.Errno) { return call(syscall.SYS_READ, fd, b) }

// Write writes b to fd once (it may write part of it), retrying on EINTR.
func Write(fd uintptr, b []byte) (int, syscall.Errno) { return call(syscall.SYS_WRITE, fd, b) }

// call makes the read or write trap of b on fd.
func call(trap, fd uintptr, b []byte) (int, syscall.Errno) {
	if len(b) == 0 {
		return 0, 0
	}
	for {
		n, _, e := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e != syscall.EINTR {
			if e != 0 {
				return 0, e
			}
			return int(n), 0
		}
	}
}

// EpollWait collects the ready events of the epoll instance epfd into
// events without waiting (a zero timeout), retrying on EINTR.
func EpollWait(epfd int, events []syscall.EpollEvent) (int, syscall.Errno) {
	if len(events) == 0 {
		return 0, 0
	}
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
		if e != syscall.EINTR {
			if e != 0 {
				return 0, e
			}
			return int(n), 0
		}
	}
}

// SendBuffer returns the size of the socket fd's send buffer
// (SO_SNDBUF), 0 when it cannot tell.
func SendBuffer(fd uintptr) int {
	size, ok := socketInt(fd, syscall.SO_SNDBUF)
	if !ok {
		return 0
	}
	return int(size)
}

// socketInt reads the socket-level option opt of fd, an int.
func socketInt(fd uintptr, opt int) (int32, bool) {
	var v int32
	l := uint32(unsafe.Sizeof(v))
	_, _, e := syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, fd, syscall.SOL_SOCKET, uintptr(opt),
		uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&l)), 0)
	return v, e == 0
}

// Unsent returns how many bytes wait in the socket fd's send queue,
// unsent or unacknowledged (TIOCOUTQ); ok is false when it cannot tell.
func Unsent(fd uintptr) (n int, ok bool) {
	var queued int32
	if _, _, e := syscall.RawSyscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&queued))); e != 0 {
		return 0, false
	}
	return int(queued), true
}

// Apart reports whether the last bytes that came on the socket fd were
// received on another CPU than the one the caller runs on: on loopback,
// whether its peer wrote them from another CPU. ok is false when it
// cannot tell.
func Apart(fd uintptr) (apart, ok bool) {
	in, ok := socketInt(fd, unix.SO_INCOMING_CPU)
	if !ok || in < 0 {
		return false, false
	}
	var cpu uint32
	if _, _, e := syscall.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); e != 0 {
		return false, false
	}
	return uint32(in) != cpu, true
}
