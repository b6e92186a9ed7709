package guard

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestCheck: the keys of a command are found where Redis says they are,
// by the COMMAND table's positions or, for the commands whose keys move,
// by COMMAND GETKEYS; those with the prefix, and the commands that wipe,
// move or copy every key, are refused with an *Error.
func TestCheck(t *testing.T) {
	srv := redistest.Start(t)
	g := New("lock:", &redis.Options{Addr: srv.Addr}, 2*time.Second)
	t.Cleanup(g.Close)
	tests := []struct {
		give    string
		refused bool
	}{
		{"GET k", false},
		{"GET lock:a", true},
		{"SET k lock:a", false}, // a value, not a key
		{"MSET k v lock:a v", true},
		{"EVAL return 1 lock:a", true},
		{"EVAL return 1 k", false},
		{"SORT k BY lock:*", true},
		{"FLUSHALL", true},
		{"SWAPDB 0 1", true},
		{"NOSUCHCOMMAND lock:a", false}, // Redis answers it with its error
		{"MIGRATE h 1 lock:a 0 10 AUTH2 u s3cret", true},
		{"MIGRATE h 1 k 0 10 AUTH s3cret", false},
		{"MIGRATE h 1 \"\" 0 10 AUTH s3cret KEYS k lock:a", true},
	}
	// MIGRATE's keys are found without COMMAND GETKEYS, which the
	// backend would log with the password in clear.
	srv.Do("CONFIG", "SET", "slowlog-log-slower-than", "0")
	for _, tt := range tests {
		var args [][]byte
		for _, f := range strings.Fields(tt.give) {
			args = append(args, []byte(f))
		}
		for i, a := range args {
			if string(a) == `""` {
				args[i] = nil
			}
		}
		err := g.Check([]byte(strings.ToLower(string(args[0]))), args)
		var e *Error
		if errors.As(err, &e) != tt.refused || (err != nil && e == nil) {
			t.Errorf("Check(%q) = %v, want refused %v", tt.give, err, tt.refused)
		}
	}
	if log, err := srv.DoAll("SLOWLOG", "GET", "-1"); err != nil || strings.Contains(log, "s3cret") {
		t.Errorf("the backend's slow log holds MIGRATE's password (or cannot be read: %v): %s", err, log)
	}
}

// TestCheckUnavailable: a backend that cannot say where the keys are is
// an error of its own, not a refusal.
func TestCheckUnavailable(t *testing.T) {
	g := New("lock:", &redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}, 200*time.Millisecond)
	t.Cleanup(g.Close)
	err := g.Check([]byte("get"), [][]byte{[]byte("GET"), []byte("k")})
	var e *Error
	if err == nil || errors.As(err, &e) {
		t.Errorf("Check with no backend = %v, want an error that is no *Error", err)
	}
}
