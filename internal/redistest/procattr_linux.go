package redistest

import "syscall"

// procAttr has the kernel kill a server the moment the test binary dies,
// so that a crashed or killed test run leaves no redis-server behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
