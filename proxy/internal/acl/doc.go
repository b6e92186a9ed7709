// Package acl is the rule engine of Redis's ACL at the proxy, the part
// that knows no client: the users the configuration defines, parsed from
// aclfile lines (ParseUser), with the rules on the lock commands kept
// here and the others installed on each node with ACL SETUSER (Engine,
// Prepare); a user's sign-in on a backend connection (SignIn); and the
// checks of lock commands' resources, asked of Redis with ACL DRYRUN on
// control connections of the proxy's and cached (Verdict), with Redis's
// own wording of each refusal (CommandRefusal, DryrunNoperm, DryrunText).
// Passwords answers AUTH against the proxy's own password-only users,
// when the proxy requires a password.
// The proxy's session decides which checks a command needs
// (proxy/aclsession.go) and keeps each user's shared connections
// (proxy/acl.go).
package acl
