//go:build !linux

package backend

import "net"

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
