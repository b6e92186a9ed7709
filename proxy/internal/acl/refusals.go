package acl

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/tidwall/redcon"
)

// oldWording reports whether INFO server names a Redis older than 7.2,
// which words its ACL refusals differently.
func oldWording(info []byte) bool {
	_, v, ok := bytes.Cut(info, []byte("redis_version:"))
	if !ok {
		return false
	}
	var major, minor int
	fmt.Sscanf(string(v), "%d.%d", &major, &minor)
	return major < 7 || (major == 7 && minor < 2)
}

// dryrunRefusal turns the reply to ACL DRYRUN <user> SET|GET <resource>
// into Redis's -NOPERM reply to a command refused one of its keys; nil
// for +OK. The user may lack the key, the command SET or GET, or be gone
// (ACL DELUSER): the resource is refused alike.
func dryrunRefusal(r []byte, old bool) []byte {
	if bytes.HasPrefix(r, []byte("+OK")) {
		return nil
	}
	if old {
		return []byte("-NOPERM this user has no permissions to access one of the keys used as arguments\r\n")
	}
	return []byte("-NOPERM No permissions to access a key\r\n")
}

// CommandRefusal is Redis's -NOPERM reply to a command user may not run,
// in the wording of the backend's version (old: before Redis 7.2).
func CommandRefusal(user, name string, old bool) []byte {
	if old {
		return []byte("-NOPERM this user has no permissions to run the '" + name + "' command\r\n")
	}
	return []byte("-NOPERM User " + user + " has no permissions to run the '" + name + "' command\r\n")
}

// DryrunNoperm turns ACL DRYRUN's text of a refusal into the -NOPERM
// reply of the command refused, in the backend's wording.
func DryrunNoperm(text []byte, old bool) []byte {
	t := string(text)
	switch {
	case strings.HasSuffix(t, "' key"):
		if old {
			return []byte("-NOPERM this user has no permissions to access one of the keys used as arguments\r\n")
		}
		return []byte("-NOPERM No permissions to access a key\r\n")
	case strings.HasSuffix(t, "' channel"):
		if old {
			return []byte("-NOPERM this user has no permissions to access one of the channels used as arguments\r\n")
		}
		return []byte("-NOPERM No permissions to access a channel\r\n")
	}
	if old {
		t = strings.Replace(t, "This user", "this user", 1)
	}
	return []byte("-NOPERM " + t + "\r\n")
}

// DryrunText is ACL DRYRUN's bulk reply for a refusal.
func DryrunText(old bool, user, what string) []byte {
	who := "This user"
	if !old {
		who = "User " + user
	}
	return redcon.AppendBulkString(nil, who+" has no permissions to "+what)
}

// AuthUser returns the user an AUTH or HELLO ... AUTH signs in as.
func AuthUser(raw []byte) string {
	cmd, err := redcon.Parse(raw)
	if err != nil || len(cmd.Args) < 2 {
		return ""
	}
	if bytes.EqualFold(cmd.Args[0], []byte("auth")) {
		if len(cmd.Args) == 2 {
			return "default"
		}
		return string(cmd.Args[1])
	}
	for i := 2; i+1 < len(cmd.Args); i++ {
		if bytes.EqualFold(cmd.Args[i], []byte("auth")) {
			return string(cmd.Args[i+1])
		}
	}
	return ""
}
