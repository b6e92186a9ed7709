package proxy

import (
	"crypto/subtle"
	"strings"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Redis's own replies for authentication.
var (
	replyNoAuth      = []byte("-NOAUTH Authentication required.\r\n")
	replyNoAuthHello = []byte("-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n")
	replyWrongPass   = []byte("-WRONGPASS invalid username-password pair or user is disabled.\r\n")
	replyOK          = resp.ReplyOK
	replyAuthArity   = []byte("-ERR wrong number of arguments for 'auth' command\r\n")
	replySyntax      = resp.ReplySyntax
)

// authenticator answers AUTH at the proxy, against its own users, when
// the proxy requires a password. Clients then never authenticate to the
// backend themselves: the proxy does so with its configured credentials.
type authenticator struct {
	users map[string]string
}

func newAuthenticator(users map[string]string) *authenticator {
	if len(users) == 0 {
		return nil
	}
	return &authenticator{users: users}
}

// check reports whether user and password match, in constant time for the
// password.
func (a *authenticator) check(user, password []byte) bool {
	want, ok := a.users[string(user)]
	match := subtle.ConstantTimeCompare([]byte(want), password) == 1
	return ok && match
}

// gate decides what happens to cmd under proxy authentication. It returns
// the reply when the proxy answers the command itself, or, for HELLO with
// AUTH, the request to forward in its place (the same HELLO without its
// credentials). authed tells whether the client is signed in; the result
// is whether it is after cmd.
func (a *authenticator) gate(authed bool, name []byte, args [][]byte) (reply, rewritten []byte, nowAuthed bool) {
	switch string(name) {
	case "auth":
		var ok bool
		switch len(args) {
		case 2:
			ok = a.check([]byte("default"), args[1])
		case 3:
			ok = a.check(args[1], args[2])
		case 1:
			return replyAuthArity, nil, authed
		default:
			return replySyntax, nil, authed
		}
		if !ok {
			return replyWrongPass, nil, authed
		}
		return replyOK, nil, true
	case "hello":
		out := make([]string, 0, len(args))
		hadAuth := false
		for i := 0; i < len(args); i++ {
			if i >= 2 && strings.EqualFold(string(args[i]), "auth") && i+2 < len(args) {
				if !a.check(args[i+1], args[i+2]) {
					return replyWrongPass, nil, authed
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
		return nil, command(out...), true
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
