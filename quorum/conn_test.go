package quorum

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestRaceDial: while a dial hangs (its SYN dropped), the next one starts
// a step later and the first connection made wins; the others are closed
// and awaited. A refused dial ends the race at once; dials that all time
// out end it when the context does.
func TestRaceDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	const step = 20 * time.Millisecond
	var d net.Dialer

	t.Run("a later dial wins over a hanging one", func(t *testing.T) {
		var calls, hung atomic.Int32
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			if calls.Add(1) <= 2 { // the first two SYNs are dropped
				<-ctx.Done()
				hung.Add(1)
				return nil, ctx.Err()
			}
			return d.DialContext(ctx, network, addr)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		c, err := raceDial(ctx, dial, "tcp", ln.Addr().String(), step)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("raceDial: %v", err)
		}
		c.Close()
		if took < 2*step || took > 25*step {
			t.Errorf("connected after %v, want about 2 steps (%v)", took, 2*step)
		}
		if n, h := calls.Load(), hung.Load(); n != 3 || h != 2 {
			t.Errorf("%d dials, %d of them hung and ended, want 3 and 2", n, h)
		}
	})

	t.Run("a refused dial ends the race", func(t *testing.T) {
		var calls atomic.Int32
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			calls.Add(1)
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		_, err := raceDial(ctx, dial, "tcp", ln.Addr().String(), step)
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > step || calls.Load() != 1 {
			t.Errorf("raceDial: %v after %v and %d dials, want the refusal at once", err, time.Since(start), calls.Load())
		}
	})

	t.Run("every dial times out", func(t *testing.T) {
		var calls atomic.Int32
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			calls.Add(1)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*step+step/2)
		defer cancel()
		_, err := raceDial(ctx, dial, "tcp", ln.Addr().String(), step)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("raceDial: %v, want the deadline", err)
		}
		if n := calls.Load(); n < 2 || n > 4 {
			t.Errorf("%d dials in 3.5 steps, want one a step (4)", n)
		}
	})
}
