package commands

import "strconv"

// Resources returns the resources a lock command names, which Redis's
// ACL at the proxy checks as keys of the same name, and whether the
// command changes them (LOCK, RLOCK, MLOCK, UNLOCK, EXTEND: write
// access) or only reads them (LOCKINFO: read access). ok is false when
// args is no lock command or its arity is wrong: the command answers
// that itself, before any ACL check, as Redis does. An MLOCK whose count
// is not a number names no resource; it is refused for its syntax.
func Resources(args [][]byte) (resources [][]byte, write, ok bool) {
	if len(args) == 0 {
		return nil, false, false
	}
	s := lookup(args[0])
	if s == nil || !arityOK(s.arity, len(args)) {
		return nil, false, false
	}
	if len(args) < 2 {
		return nil, true, true // a command of no resource
	}
	switch s.name {
	case "lockinfo":
		return args[1:2], false, true
	case "mlock":
		n, err := strconv.ParseInt(string(args[1]), 10, 64)
		if err != nil || n <= 0 || n > int64(len(args)-2) || len(args) < 3 {
			return nil, true, true
		}
		return args[2 : 2+n], true, true
	}
	return args[1:2], true, true
}

// arityOK reports whether n arguments (the name included) fit arity, as
// COMMAND INFO gives it.
func arityOK(arity, n int) bool {
	if arity < 0 {
		return n >= -arity
	}
	return n == arity
}

// Categories returns each lock command's ACL categories, as COMMAND INFO
// lists them without their "@": @lock, the lock commands' own, and
// @write or @read, and @slow.
func Categories() map[string][]string {
	out := make(map[string][]string, len(specs))
	for _, s := range specs {
		for _, c := range s.acl {
			out[s.name] = append(out[s.name], c[1:])
		}
	}
	return out
}
