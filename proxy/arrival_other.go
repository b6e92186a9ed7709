//go:build !linux

package proxy

import "net"

// arrivals keeps clients' commands in arrival order on Linux only
// (arrival_linux.go); elsewhere each client's commands keep their own
// order and nothing more.
type arrivals struct{}

type arrival struct{}

func newArrivals() (*arrivals, error) { return nil, nil }
func (o *arrivals) close()            {}
func (o *arrivals) wrap(nc net.Conn) (net.Conn, *arrival, error) {
	return nc, nil, nil
}
func (a *arrival) end()    {}
func (a *arrival) wait()   {}
func (a *arrival) remove() {}
