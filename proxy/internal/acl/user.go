package acl

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// User is a user the configuration defines. It is not changed once
// parsed, and safe for concurrent use.
type User struct {
	// Name is the user's name.
	Name string
	// setuser is the ACL SETUSER that installs the user: "reset" and
	// its rules other than the lock rules.
	setuser []byte
	// lock is the lock commands the user may run (lower case).
	lock map[string]bool
}

// LockAllowed reports whether u may run the lock command name (lower
// case).
func (u *User) LockAllowed(name string) bool { return u.lock[name] }

// ParseUser parses one aclfile line, "user <name> <rules...>".
// categories are the lock commands' ACL categories, by command: a rule
// on a category (+@write, -@lock, +@all ...) or on a lock command
// (+lock, -unlock) applies to the lock commands as Redis applies it to
// its own, in order; the rules on @lock and on the lock commands stay at
// the proxy, the others go to Redis.
func ParseUser(line string, categories map[string][]string) (*User, error) {
	args, err := Split(line)
	if err != nil {
		return nil, err
	}
	if len(args) < 2 || !strings.EqualFold(args[0], "user") {
		return nil, fmt.Errorf("acl: %q: a line is \"user <name> <rules...>\"", line)
	}
	u := &User{Name: args[1], lock: map[string]bool{}}
	if u.Name == "" {
		return nil, fmt.Errorf("acl: %q: bad user name", line)
	}
	set := func(allow bool, match func(name string, cats []string) bool) {
		for name, cats := range categories {
			if match(name, cats) {
				u.lock[name] = allow
			}
		}
	}
	all := func(string, []string) bool { return true }
	rules := []string{"ACL", "SETUSER", u.Name, "reset"}
	for _, r := range args[2:] {
		l := strings.ToLower(r)
		switch {
		case l == "reset" || l == "nocommands":
			set(false, all)
		case l == "allcommands":
			set(true, all)
		case len(l) > 2 && (l[0] == '+' || l[0] == '-') && l[1] == '@':
			cat := l[2:]
			set(l[0] == '+', func(_ string, cats []string) bool {
				return cat == "all" || slices.Contains(cats, cat)
			})
			if cat == "lock" {
				continue // Redis knows no such category
			}
		case len(l) > 1 && (l[0] == '+' || l[0] == '-'):
			name, _, sub := strings.Cut(l[1:], "|")
			if _, ok := categories[name]; ok {
				if sub {
					return nil, fmt.Errorf("acl: %q: the lock commands have no subcommands", r)
				}
				set(l[0] == '+', func(n string, _ []string) bool { return n == name })
				continue // Redis knows no such command
			}
		}
		rules = append(rules, r)
	}
	u.setuser = resp.Command(rules...)
	return u, nil
}

// Split splits an aclfile line into its arguments as Redis does:
// words separated by spaces, double or single quotes around a word, and a
// selector, "(...)", one argument however many spaces it holds.
func Split(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in := false // a word has started
	depth := 0
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case depth == 0 && (c == '"' || c == '\''):
			j := strings.IndexByte(line[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("acl: %q: unbalanced quotes", line)
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			in = true
		case c == '(':
			depth++
			cur.WriteByte(c)
			in = true
		case c == ')':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("acl: %q: unbalanced parentheses", line)
			}
			cur.WriteByte(c)
		case depth == 0 && (c == ' ' || c == '\t' || c == '\r' || c == '\n'):
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("acl: %q: unbalanced parentheses", line)
	}
	if in {
		out = append(out, cur.String())
	}
	return out, nil
}
