package commands

import (
	"testing"
)

func TestParsePermitsAndRLock(t *testing.T) {
	h := mustNew(t, nil, Config{MaxTTL: testConfig.MaxTTL, MaxWait: testConfig.MaxWait, MaxPermits: 8}, nil)
	tests := []struct {
		give    []string
		permits int64
		err     string
	}{
		{give: []string{"LOCK", "r", "1000", "PERMITS", "3"}, permits: 3},
		{give: []string{"lock", "r", "1000", "permits", "8", "WAIT", "10"}, permits: 8},
		{give: []string{"LOCK", "r", "1000", "PERMITS", "1"}, permits: 1},
		{give: []string{"LOCK", "r", "1000", "PERMITS", "0"}, err: "ERR PERMITS must be a positive integer"},
		{give: []string{"LOCK", "r", "1000", "PERMITS", "-2"}, err: "ERR PERMITS must be a positive integer"},
		{give: []string{"LOCK", "r", "1000", "PERMITS", "9"}, err: "ERR PERMITS exceeds the maximum of 8"},
		{give: []string{"LOCK", "r", "1000", "PERMITS", "two"}, err: "ERR value is not an integer or out of range"},
		{give: []string{"LOCK", "r", "1000", "PERMITS"}, err: "ERR syntax error"},
		{give: []string{"LOCK", "r", "1000", "PERMITS", "2", "PERMITS", "2"}, err: "ERR syntax error"},
	}
	for _, tt := range tests {
		a, err := h.parseLock(argv(tt.give...))
		if errText(err) != tt.err || (err == nil && a.permits != tt.permits) {
			t.Errorf("parseLock(%q) = permits %d, %v; want %d, %q", tt.give, a.permits, err, tt.permits, tt.err)
		}
	}
	rtests := []struct {
		give []string
		err  string
	}{
		{give: []string{"RLOCK", "r", "1000", "WAIT", "10", "TOKEN", "t", "KEEPALIVE"}},
		{give: []string{"RLOCK", "r"}, err: "ERR wrong number of arguments for 'rlock' command"},
		{give: []string{"RLOCK", "r", "0"}, err: "ERR invalid expire time in 'rlock' command"},
		{give: []string{"RLOCK", "r", "1000", "PERMITS", "2"}, err: "ERR syntax error"},
		{give: []string{"RLOCK", "r", "1000", "WAIT"}, err: "ERR syntax error"},
	}
	for _, tt := range rtests {
		if _, err := h.parseRLock(argv(tt.give...)); errText(err) != tt.err {
			t.Errorf("parseRLock(%q) = %v, want %q", tt.give, err, tt.err)
		}
	}
	lock := argv("LOCK", "r", "1000", "PERMITS", "3")
	if n := testing.AllocsPerRun(100, func() { h.parseLock(lock) }); n != 0 {
		t.Errorf("parseLock with PERMITS allocates %v times, want 0", n)
	}
}
