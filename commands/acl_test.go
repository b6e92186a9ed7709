package commands

import (
	"fmt"
	"testing"
)

// TestResources: each lock command's resources and access, and no
// resource where the arity is wrong.
func TestResources(t *testing.T) {
	for _, tc := range []struct {
		args  string
		res   string
		write bool
		ok    bool
	}{
		{"LOCK a 1000", "[a]", true, true},
		{"lock a 1000 WAIT 10 TOKEN t KEEPALIVE", "[a]", true, true},
		{"RLOCK a 1000", "[a]", true, true},
		{"UNLOCK a", "[a]", true, true},
		{"UNLOCK a t HOLD 2", "[a]", true, true},
		{"EXTEND a 1000 t", "[a]", true, true},
		{"MLOCK 2 a b 1000", "[a b]", true, true},
		{"MLOCK 3 a b 1000", "[a b 1000]", true, true},
		{"MLOCK x a b 1000", "[]", true, true},
		{"MLOCK 9 a b 1000", "[]", true, true},
		{"LOCKINFO a", "[a]", false, true},
		{"LOCKS 0", "[]", false, true},
		{"LOCKS 0 MATCH a* COUNT 10", "[]", false, true},
		{"LOCK a", "[]", false, false},
		{"LOCKINFO a b", "[]", false, false},
		{"MLOCK 1 a", "[]", false, false},
		{"GET a", "[]", false, false},
	} {
		var args [][]byte
		for _, a := range splitWords(tc.args) {
			args = append(args, []byte(a))
		}
		res, write, ok := Resources(args)
		if got := fmt.Sprintf("%s", res); got != tc.res || write != tc.write || ok != tc.ok {
			t.Errorf("%s: %s %v %v, want %s %v %v", tc.args, got, write, ok, tc.res, tc.write, tc.ok)
		}
	}
	if c := Categories(); fmt.Sprint(c["lock"]) != "[write slow lock]" || fmt.Sprint(c["lockinfo"]) != "[read slow lock]" {
		t.Errorf("categories %v", c)
	}
}

func splitWords(s string) []string {
	var out []string
	word := ""
	for _, c := range s + " " {
		if c == ' ' {
			if word != "" {
				out = append(out, word)
			}
			word = ""
			continue
		}
		word += string(c)
	}
	return out
}
