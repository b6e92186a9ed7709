//go:build !linux

package backend

import (
	"errors"
	"net"
)

// Arrivals keeps clients' commands in arrival order on Linux only
// (arrival_linux.go); elsewhere each client's commands keep their own
// order and nothing more.
type Arrivals struct{}

// Arrival is one client socket's place in the arrival order: none here.
type Arrival struct{}

// NewArrivals returns nil: there is no arrival order to keep.
func NewArrivals() (*Arrivals, error) { return nil, nil }

// Close does nothing.
func (o *Arrivals) Close() {}

// Wrap returns nc as it is.
func (o *Arrivals) Wrap(nc net.Conn) (net.Conn, *Arrival, error) {
	return nc, nil, nil
}

// End does nothing.
func (a *Arrival) End() {}

// Wait does nothing.
func (a *Arrival) Wait() {}

// Remove does nothing.
func (a *Arrival) Remove() {}

// Loop returns an error: there is no reading loop.
func (o *Arrivals) Loop() (func(serve func(ready []*Arrival)), error) {
	return nil, errors.New("proxy: no reading loop on this platform")
}

// Serve reports false: there is no loop.
func (a *Arrival) Serve(owner any) bool { return false }

// Owner returns nil.
func (a *Arrival) Owner() any { return nil }

// StartRead does nothing.
func (a *Arrival) StartRead() {}

// Read does nothing.
func (a *Arrival) Read(n int) {}

// Done does nothing.
func (a *Arrival) Done(full bool) {}

// Unloop does nothing.
func (a *Arrival) Unloop() {}
