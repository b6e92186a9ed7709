// Package condwait is a sync.Cond wait bounded in time, which the reply
// queues of the session and of a cluster client both use.
package condwait

import (
	"sync"
	"time"
)

// Wait waits on c until done reports true or d has passed; c.L is held on
// entry and on return.
func Wait(c *sync.Cond, d time.Duration, done func() bool) {
	timedOut := false
	t := time.AfterFunc(d, func() {
		c.L.Lock()
		timedOut = true
		c.Broadcast()
		c.L.Unlock()
	})
	for !done() && !timedOut {
		c.Wait()
	}
	t.Stop()
}
