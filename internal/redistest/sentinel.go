package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Group is a primary with replicas watched by Sentinels, as a highly
// available Redis is deployed, all on loopback. The Sentinels fail over
// within about DownAfter plus a second or two (their election).
type Group struct {
	MasterName string
	// Primary is the primary the group started with, Replicas its
	// replicas then; after a failover, CurrentPrimary tells which is
	// primary.
	Primary   *Server
	Replicas  []*Server
	Sentinels []*Server
	// DownAfter and FailoverTimeout are the Sentinels'
	// down-after-milliseconds and failover-timeout.
	DownAfter, FailoverTimeout time.Duration

	tb testing.TB
}

// StartGroup starts a primary, replicas replicas of it and sentinels
// Sentinels (quorum: a majority of them) monitoring it as masterName, with
// short failure-detection times (down-after-milliseconds 1000,
// failover-timeout 3000), and waits until every Sentinel knows
// every replica and every other Sentinel, so that a failover can start at
// once. Sentinels run as redis-sentinel, which is installed (Debian's
// package) when missing and the tests run as root.
func StartGroup(tb testing.TB, masterName string, replicas, sentinels int) *Group {
	tb.Helper()
	if err := install("redis-sentinel", "redis-sentinel"); err != nil {
		tb.Fatalf("redis-sentinel is missing and could not be installed: %v", err)
	}
	g := &Group{
		MasterName:      masterName,
		DownAfter:       time.Second,
		FailoverTimeout: 3 * time.Second,
		tb:              tb,
	}
	g.Primary = Start(tb)
	for range replicas {
		g.Replicas = append(g.Replicas, Start(tb, "--replicaof", "127.0.0.1", strconv.Itoa(g.Primary.Port())))
	}
	g.waitReplicas()
	quorum := sentinels/2 + 1
	for range sentinels {
		s := &Server{tb: tb, dir: tb.TempDir(), bin: "redis-sentinel"}
		s.conf = filepath.Join(s.dir, "sentinel.conf")
		s.launch(func(int) error {
			// Sentinel rewrites its file: it must be writable, and one per
			// Sentinel.
			conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d %[3]d\n"+
				"sentinel down-after-milliseconds %[1]s %[4]d\n"+
				"sentinel failover-timeout %[1]s %[5]d\n"+
				"sentinel parallel-syncs %[1]s %[6]d\n",
				masterName, g.Primary.Port(), quorum, g.DownAfter.Milliseconds(), g.FailoverTimeout.Milliseconds(), max(replicas, 1))
			return os.WriteFile(s.conf, []byte(conf), 0o600)
		})
		g.Sentinels = append(g.Sentinels, s)
	}
	g.waitSentinels(replicas, sentinels-1)
	// A failed test shows what the Sentinels did: their events (+sdown,
	// +try-failover, +switch-master, ...) are in their logs.
	tb.Cleanup(func() {
		if !tb.Failed() {
			return
		}
		for _, s := range g.Sentinels {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			tb.Logf("Sentinel %s log:\n%s", s.Addr, lastLines(string(log), 60))
		}
	})
	return g
}

// SentinelAddrs returns the Sentinels' addresses.
func (g *Group) SentinelAddrs() []string {
	addrs := make([]string, len(g.Sentinels))
	for i, s := range g.Sentinels {
		addrs[i] = s.Addr
	}
	return addrs
}

// Servers returns the primary and the replicas the group started with.
func (g *Group) Servers() []*Server { return append([]*Server{g.Primary}, g.Replicas...) }

// waitReplicas waits until every replica is in sync with the primary.
func (g *Group) waitReplicas() {
	g.tb.Helper()
	for _, r := range g.Replicas {
		g.waitFor(10*time.Second, "replica "+r.Addr+" in sync", func(ctx context.Context) (bool, error) {
			info, err := r.Info(ctx, "replication")
			return strings.Contains(info, "master_link_status:up"), err
		})
	}
}

// waitSentinels waits until each Sentinel knows replicas replicas and
// others other Sentinels.
func (g *Group) waitSentinels(replicas, others int) {
	g.tb.Helper()
	for _, s := range g.Sentinels {
		g.waitFor(20*time.Second, "Sentinel "+s.Addr+" knows the group", func(ctx context.Context) (bool, error) {
			c := g.sentinelClient(s)
			defer c.Close()
			m, err := c.Master(ctx, g.MasterName).Result()
			if err != nil {
				return false, err
			}
			return m["num-slaves"] == strconv.Itoa(replicas) && m["num-other-sentinels"] == strconv.Itoa(others), nil
		})
	}
}

// CurrentPrimary returns the server a majority of the Sentinels name as
// primary, failing the test when they do not agree within 10 s.
func (g *Group) CurrentPrimary() *Server {
	g.tb.Helper()
	var found *Server
	g.waitFor(10*time.Second, "the Sentinels agree on a primary", func(ctx context.Context) (bool, error) {
		votes := map[string]int{}
		for _, s := range g.Sentinels {
			c := g.sentinelClient(s)
			a, err := c.GetMasterAddrByName(ctx, g.MasterName).Result()
			c.Close()
			if err == nil && len(a) == 2 {
				votes[a[0]+":"+a[1]]++
			}
		}
		for addr, n := range votes {
			if n > len(g.Sentinels)/2 {
				for _, srv := range g.Servers() {
					if srv.Addr == addr {
						found = srv
						return true, nil
					}
				}
			}
		}
		return false, nil
	})
	return found
}

// Failover asks a Sentinel to fail over now (SENTINEL FAILOVER).
func (g *Group) Failover() {
	g.tb.Helper()
	c := g.sentinelClient(g.Sentinels[0])
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Failover(ctx, g.MasterName).Err(); err != nil {
		g.tb.Fatalf("SENTINEL FAILOVER: %v", err)
	}
}

// WaitRole waits up to d until s reports role ("master" or "slave") in
// ROLE, with its replication link up when it is a replica.
func (g *Group) WaitRole(s *Server, role string, d time.Duration) {
	g.tb.Helper()
	g.waitFor(d, s.Addr+" becomes "+role, func(ctx context.Context) (bool, error) {
		info, err := s.Info(ctx, "replication")
		if err != nil {
			return false, err
		}
		ok := strings.Contains(info, "role:"+role+"\r\n")
		if role == "slave" {
			ok = ok && strings.Contains(info, "master_link_status:up")
		}
		return ok, nil
	})
}

// SwitchWatch records the +switch-master messages of every Sentinel, as
// their clients see them.
type SwitchWatch struct {
	msgs chan string
}

// WatchSwitches subscribes to every Sentinel's +switch-master; the
// subscriptions end with the test.
func (g *Group) WatchSwitches() *SwitchWatch {
	g.tb.Helper()
	w := &SwitchWatch{msgs: make(chan string, 16*len(g.Sentinels))}
	for _, s := range g.Sentinels {
		c := g.sentinelClient(s)
		ps := c.Subscribe(context.Background(), "+switch-master")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := ps.Receive(ctx) // the confirmation
		cancel()
		if err != nil {
			g.tb.Fatalf("subscribe to +switch-master on %s: %v", s.Addr, err)
		}
		ch := ps.Channel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for m := range ch {
				select {
				case w.msgs <- m.Payload:
				default:
				}
			}
		}()
		g.tb.Cleanup(func() {
			ps.Close()
			<-done
			c.Close()
		})
	}
	return w
}

// Next waits up to d for the next +switch-master of any Sentinel and
// returns when it arrived and its payload ("name old-ip old-port new-ip
// new-port").
func (w *SwitchWatch) Next(tb testing.TB, d time.Duration) (time.Time, string) {
	tb.Helper()
	select {
	case m := <-w.msgs:
		return time.Now(), m
	case <-time.After(d):
		tb.Fatalf("no +switch-master within %v", d)
	}
	return time.Time{}, ""
}

func (g *Group) sentinelClient(s *Server) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: s.Addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
}

// waitFor polls cond every 20 ms until it holds, failing the test after d
// with the last error.
func (g *Group) waitFor(d time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	g.tb.Helper()
	deadline := time.Now().Add(d)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ok, err := cond(ctx)
		cancel()
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			g.tb.Fatalf("waiting %v for %s: gave up (last error: %v)", d, what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Info returns the server's INFO section.
func (s *Server) Info(ctx context.Context, section string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	return c.Info(ctx, section).Result()
}
