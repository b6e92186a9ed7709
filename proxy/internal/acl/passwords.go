package acl

import (
	"crypto/subtle"
	"strings"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Redis's own replies for authentication.
var (
	replyNoAuth      = []byte("-NOAUTH Authentication required.\r\n")
	replyNoAuthHello = []byte("-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n")
	// ReplyWrongPass is Redis's refusal of a sign-in.
	ReplyWrongPass = []byte("-WRONGPASS invalid username-password pair or user is disabled.\r\n")
	replyAuthArity = []byte("-ERR wrong number of arguments for 'auth' command\r\n")
)

// Passwords answers AUTH at the proxy, against its own password-only
// users, when the proxy requires a password. Clients then never
// authenticate to the backend themselves: the proxy does so with its
// configured credentials. It is not changed once made, and safe for
// concurrent use.
type Passwords struct {
	users map[string]string
}

// NewPasswords returns the Passwords of users (name to password); nil,
// which lets every client in, when there are none.
func NewPasswords(users map[string]string) *Passwords {
	if len(users) == 0 {
		return nil
	}
	return &Passwords{users: users}
}

// Required returns the Passwords of users even when there are none: no
// client is let in before it signs in (under Redis's ACL at the proxy,
// where the users of the backend's own ACL sign in too).
func Required(users map[string]string) *Passwords {
	return &Passwords{users: users}
}

// Has reports whether user is one of a's.
func (a *Passwords) Has(user []byte) bool {
	_, ok := a.users[string(user)]
	return ok
}

// Check reports whether user and password match, in constant time for the
// password.
func (a *Passwords) Check(user, password []byte) bool {
	want, ok := a.users[string(user)]
	match := subtle.ConstantTimeCompare([]byte(want), password) == 1
	return ok && match
}

// Gate decides what happens to cmd under proxy authentication. It returns
// the reply when the proxy answers the command itself, or, for HELLO with
// AUTH, the request to forward in its place (the same HELLO without its
// credentials). authed tells whether the client is signed in; the result
// is whether it is after cmd.
func (a *Passwords) Gate(authed bool, name []byte, args [][]byte) (reply, rewritten []byte, nowAuthed bool) {
	switch string(name) {
	case "auth":
		var ok bool
		switch len(args) {
		case 2:
			ok = a.Check([]byte("default"), args[1])
		case 3:
			ok = a.Check(args[1], args[2])
		case 1:
			return replyAuthArity, nil, authed
		default:
			return resp.ReplySyntax, nil, authed
		}
		if !ok {
			return ReplyWrongPass, nil, authed
		}
		return resp.ReplyOK, nil, true
	case "hello":
		out := make([]string, 0, len(args))
		hadAuth := false
		for i := 0; i < len(args); i++ {
			if i >= 2 && strings.EqualFold(string(args[i]), "auth") && i+2 < len(args) {
				if !a.Check(args[i+1], args[i+2]) {
					return ReplyWrongPass, nil, authed
				}
				hadAuth = true
				i += 2
				continue
			}
			out = append(out, string(args[i]))
		}
		if !hadAuth && !authed {
			return replyNoAuthHello, nil, false
		}
		if !hadAuth {
			return nil, nil, true
		}
		return nil, resp.Command(out...), true
	case "quit":
		return nil, nil, authed
	case "reset":
		return nil, nil, false // RESET signs the client out when a password is required
	}
	if !authed {
		return replyNoAuth, nil, false
	}
	return nil, nil, true
}
