//go:build linux

package main

import "testing"

// TestFraming checks that request and reply find exactly the whole
// request or reply at the start of a buffer, and nothing in any prefix of
// it (the bytes a read may stop at).
func TestFraming(t *testing.T) {
	requests := []string{
		"*1\r\n$4\r\nPING\r\n",
		"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$0\r\n\r\n",
		"*2\r\n$3\r\nGET\r\n$12\r\nkey:\r\n000001\r\n",
	}
	for _, r := range requests {
		b := []byte(r + "*1\r\n$4\r\nPING\r\n")
		if n, err := request(b); n != len(r) || err != nil {
			t.Errorf("request(%q) = %d, %v; want %d", r, n, err, len(r))
		}
		for i := 1; i < len(r); i++ {
			if n, err := request([]byte(r[:i])); n != 0 || err != nil {
				t.Errorf("request(%q) = %d, %v; want 0 for a prefix", r[:i], n, err)
			}
		}
	}
	if _, err := request([]byte("PING\r\n")); err == nil {
		t.Error("an inline request was taken")
	}
	replies := []string{
		"+OK\r\n", "-ERR wrong\r\n", ":12\r\n", "$-1\r\n", "$3\r\nbar\r\n", "$0\r\n\r\n",
		"*-1\r\n", "*0\r\n", "*2\r\n$1\r\na\r\n*1\r\n:1\r\n", "_\r\n", ",1.5\r\n", "#t\r\n",
		"%1\r\n+k\r\n$1\r\nv\r\n", "~1\r\n+a\r\n", ">2\r\n+a\r\n+b\r\n", "=7\r\ntxt:abc\r\n",
		"|1\r\n+key\r\n+val\r\n:5\r\n", "(12345678901234567890\r\n", "!5\r\nERR x\r\n",
	}
	for _, r := range replies {
		b := []byte(r + "+OK\r\n")
		if n := reply(b); n != len(r) {
			t.Errorf("reply(%q) = %d, want %d", r, n, len(r))
		}
		for i := 1; i < len(r); i++ {
			if n := reply([]byte(r[:i])); n != 0 {
				t.Errorf("reply(%q) = %d, want 0 for a prefix", r[:i], n)
			}
		}
	}
}
