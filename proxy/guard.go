package proxy

import (
	"github.com/lockproxy/lockproxy/proxy/internal/guard"
)

// GuardError refuses a forwarded command that would touch the lock state
// (Config.ProtectedPrefix).
type GuardError = guard.Error

// newKeyGuard returns the guard of the keys that start with prefix, on
// the backend.
func newKeyGuard(prefix string, p *Proxy) *guard.Guard {
	b := &p.cfg.Backend
	opt := b.controlOptions(b.Addr)
	opt.DB = b.DB
	return guard.New(prefix, opt, b.DialTimeout)
}

// guardCheck returns a *GuardError when args would reach a protected key,
// or a *BackendError when the backend cannot say where the keys are.
func (p *Proxy) guardCheck(name []byte, args [][]byte) error {
	err := p.guard.Check(name, args)
	if err == nil {
		return nil
	}
	if _, refused := err.(*GuardError); refused {
		return err // Check returns its refusals unwrapped
	}
	return &BackendError{Err: err}
}
