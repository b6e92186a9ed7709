// Package backend holds what lies between a client session and the
// backend Redis that knows nothing of the session: the order in which
// client sockets' data arrived (Arrivals, Linux only), kept so that the
// commands of different clients reach Redis in the order Redis itself
// would have read them.
package backend
