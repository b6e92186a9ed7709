package main

import (
	"os"
	"testing"
	"time"
)

func TestStatTicks(t *testing.T) {
	// A name with spaces and a parenthesis; utime 1234, stime 56.
	const stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 1015 0 0 0 1234 56 0 0 20 0 5 0 99 1000 200\n"
	got, err := statTicks("4242", stat)
	if err != nil || got != 1290 {
		t.Fatalf("statTicks = %d, %v; want 1290", got, err)
	}
	if _, err := statTicks("1", "1 (x) S 1 2\n"); err == nil {
		t.Fatal("statTicks of a short line: no error")
	}
}

func TestSampleCPU(t *testing.T) {
	// This process and the machine: the counters exist and only grow.
	before, err := sampleCPU(os.Getpid(), []int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	// Burn CPU until this process's counter has moved by two ticks, so
	// that the difference is not at the mercy of the tick's sampling.
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for {
		for i := range 1_000_000 {
			x += i
		}
		now, err := procTicks("self")
		if err != nil {
			t.Fatal(err)
		}
		if now-before.self >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no CPU time counted in 10 s of a busy loop (x %d)", x)
		}
	}
	after, err := sampleCPU(os.Getpid(), []int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	// The same process read three times in a row: at most a tick apart.
	d := after.sub(before)
	near := func(a, b int64) bool { return a-b <= 1 && b-a <= 1 }
	if d.self < 1 || !near(d.proxy, d.self) || !near(d.nodes, d.self) || d.busy < 1 || d.total < d.busy {
		t.Fatalf("difference %+v", d)
	}
}

func TestParsePids(t *testing.T) {
	got, err := parsePids("12,34")
	if err != nil || len(got) != 2 || got[0] != 12 || got[1] != 34 {
		t.Fatalf("parsePids = %v, %v", got, err)
	}
	for _, bad := range []string{"x", "0", "-3", "1,,y"} {
		if _, err := parsePids(bad); err == nil {
			t.Errorf("parsePids(%q): no error", bad)
		}
	}
}
