package acl

import (
	"strings"
	"testing"
)

// TestPasswordsGate: what the proxy answers or forwards for each command
// of a client, signed in or not, when it requires a password.
func TestPasswordsGate(t *testing.T) {
	a := NewPasswords(map[string]string{"default": "pw", "ann": "secret"})
	tests := []struct {
		give        string
		authed      bool
		wantReply   string
		wantForward string // the request forwarded in cmd's place, "" for cmd itself
		wantAuthed  bool
	}{
		{"GET k", false, "-NOAUTH Authentication required.\r\n", "", false},
		{"GET k", true, "", "", true},
		{"AUTH pw", false, "+OK\r\n", "", true},
		{"AUTH ann secret", false, "+OK\r\n", "", true},
		{"AUTH ann pw", true, "-WRONGPASS invalid username-password pair or user is disabled.\r\n", "", true},
		{"AUTH", false, "-ERR wrong number of arguments for 'auth' command\r\n", "", false},
		{"AUTH a b c", false, "-ERR syntax error\r\n", "", false},
		{"HELLO 3", false, string(replyNoAuthHello), "", false},
		{"HELLO 3", true, "", "", true},
		{"HELLO 3 AUTH ann secret SETNAME x", false, "", "*4\r\n$5\r\nHELLO\r\n$1\r\n3\r\n$7\r\nSETNAME\r\n$1\r\nx\r\n", true},
		{"HELLO 3 AUTH ann nope", false, "-WRONGPASS invalid username-password pair or user is disabled.\r\n", "", false},
		{"QUIT", false, "", "", false},
		{"RESET", true, "", "", false},
	}
	for _, tt := range tests {
		var args [][]byte
		for _, f := range strings.Fields(tt.give) {
			args = append(args, []byte(f))
		}
		name := []byte(strings.ToLower(string(args[0])))
		reply, forward, authed := a.Gate(tt.authed, name, args)
		if string(reply) != tt.wantReply || string(forward) != tt.wantForward || authed != tt.wantAuthed {
			t.Errorf("Gate(%v, %q) = %q, %q, %v; want %q, %q, %v", tt.authed, tt.give, reply, forward, authed, tt.wantReply, tt.wantForward, tt.wantAuthed)
		}
	}
	if NewPasswords(nil) != nil {
		t.Error("NewPasswords(nil) requires a password")
	}
	if r := Required(nil); r == nil || r.Has([]byte("default")) {
		t.Error("Required(nil) must require a sign-in and know no user")
	}
}
