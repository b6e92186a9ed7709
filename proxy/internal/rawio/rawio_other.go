//go:build !linux

package rawio

import "syscall"

// Read reads into b from fd, retrying on EINTR. Outside Linux it is
// syscall.Read.
func Read(fd uintptr, b []byte) (int, syscall.Errno) { return call(syscall.Read, fd, b) }

// Write writes b to fd once (it may write part of it), retrying on EINTR.
// Outside Linux it is syscall.Write.
func Write(fd uintptr, b []byte) (int, syscall.Errno) { return call(syscall.Write, fd, b) }

// call makes the read or write f of b on fd.
func call(f func(int, []byte) (int, error), fd uintptr, b []byte) (int, syscall.Errno) {
	for {
		n, err := f(int(fd), b)
		if err != syscall.EINTR {
			if err != nil {
				return 0, err.(syscall.Errno)
			}
			return n, 0
		}
	}
}

// SendBuffer returns 0: outside Linux it cannot tell.
func SendBuffer(fd uintptr) int { return 0 }

// Unsent returns false: outside Linux it cannot tell.
func Unsent(fd uintptr) (n int, ok bool) { return 0, false }

// Apart reports false, not ok: outside Linux it cannot tell.
func Apart(fd uintptr) (apart, ok bool) { return false, false }
