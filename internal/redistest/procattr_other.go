//go:build !linux

package redistest

import "syscall"

// procAttr is nil where the kernel cannot kill a child with its parent:
// there a test binary that dies before its cleanup leaves its servers
// running. The tests stop every server they start.
func procAttr() *syscall.SysProcAttr { return nil }
