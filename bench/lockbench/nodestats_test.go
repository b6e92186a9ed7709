package main

import "testing"

func TestNodeStats(t *testing.T) {
	parse := func(info string) nodeStats {
		s := nodeStats{calls: map[string]int64{}, usec: map[string]int64{}}
		if err := parseCommandStats(info, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := parse("# Commandstats\r\ncmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=2,usec=20,usec_per_call=10.00\r\n")
	after := parse("# Commandstats\r\ncmdstat_evalsha:calls=16,usec=190,usec_per_call=11.88,rejected_calls=0,failed_calls=0\r\ncmdstat_get:calls=6,usec=6,usec_per_call=1.00\r\ncmdstat_info:calls=3,usec=30,usec_per_call=10.00\r\n")
	d := after.sub(before, 1)
	if d.calls["evalsha"] != 6 || d.usec["evalsha"] != 90 || d.calls["get"] != 6 {
		t.Errorf("difference %v %v", d.calls, d.usec)
	}
	if _, ok := d.calls["info"]; ok {
		t.Errorf("the INFO that read the stats counted: %v", d.calls)
	}
	calls, usec := d.total()
	if calls != 12 || usec != 96 {
		t.Errorf("total %d calls %d usec, want 12 and 96", calls, usec)
	}
	if c, u := d.scripts(); c != 6 || u != 90 {
		t.Errorf("scripts %d calls %d usec, want 6 and 90", c, u)
	}
	if got := d.breakdown(3); got != "evalsha 2.00, get 2.00" {
		t.Errorf("breakdown %q", got)
	}
}
