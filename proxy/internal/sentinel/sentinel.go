// Package sentinel follows the primary of a Sentinel-managed backend:
// the Follower asks the Sentinels (and listens for +switch-master), checks
// the address they name with ROLE, and owns every backend connection
// dialled to the primary (Track), closing them all when it changes. It
// knows nothing of clients; the proxy dials through it.
package sentinel

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Config says how to find the backend through Redis Sentinel
// instead of at a fixed address. The proxy asks the Sentinels for the
// current primary, checks with ROLE that it is one, and follows every
// change (see follower).
type Config struct {
	// MasterName is the name the Sentinels monitor the primary under.
	MasterName string
	// Addrs are the Sentinels' host:port addresses.
	Addrs []string
	// Username and Password, when set, authenticate to the Sentinels:
	// their own credentials, not the backend's.
	Username, Password string
	// TLS, when set, is used to connect to the Sentinels.
	TLS *tls.Config
	// CheckInterval is how often the Sentinels are asked besides their
	// +switch-master notifications, which may be missed while a
	// subscription is reconnecting. Default 1s.
	CheckInterval time.Duration
	// Timeout bounds one query to a Sentinel. Default 500ms.
	Timeout time.Duration
}

func (c *Config) Enabled() bool { return c.MasterName != "" || len(c.Addrs) > 0 }

func (c *Config) Validate() error {
	switch {
	case c.MasterName == "":
		return errors.New("proxy: sentinel master name is empty")
	case len(c.Addrs) == 0:
		return errors.New("proxy: no sentinel addresses")
	case c.CheckInterval <= 0 || c.Timeout <= 0:
		return errors.New("proxy: sentinel check interval and timeout must be positive")
	}
	for _, a := range c.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("proxy: sentinel address %q: want host:port", a)
		}
	}
	return nil
}

// BackendStatus is where the proxy forwards commands to.
type Status struct {
	// Primary is the address commands go to; "" while the Sentinels name
	// no primary the proxy could confirm.
	Primary string
	// Failovers counts the changes of primary the proxy has followed.
	Failovers uint64
	// Sentinel reports whether the primary is found through Sentinel;
	// the fields below are set only then.
	Sentinel bool
	// Sentinels is how many are configured, SentinelsAnswering how many
	// answered the last query.
	Sentinels, SentinelsAnswering int
	// SentinelsSilentSince is when no Sentinel has answered since; zero
	// while one answers. The proxy then keeps the last primary it knew.
	SentinelsSilentSince time.Time
	// Since is when Primary was adopted or, while none is known, lost.
	Since time.Time
	// Reason says why no primary is known.
	Reason string
}

// follower tracks the primary of a Sentinel-managed backend and owns the
// backend connections dialled to it, so that a change of primary closes
// every one of them at once.
//
// It learns of a change three ways: a +switch-master message from any
// Sentinel (each has a subscription), a poll of every Sentinel (every
// CheckInterval, and at once after a lost backend connection, a failed
// dial or a -READONLY reply), and ROLE on the address they name. When the
// Sentinels announce or name another primary, the current one is dropped
// at once, before the new one is confirmed: every backend connection to it
// is closed under the same lock that hands out the address, so no command
// is written to the old primary after that moment, and no connection
// dialled before it is handed out after it (track checks the generation).
// The new address is used once ROLE says "master". Answers of Sentinels
// that disagree (one has not heard of a failover yet) are ordered by
// their config-epoch, and the proxy never goes back to an older epoch.
//
// When no Sentinel answers, the proxy keeps the primary it knew, and says
// so in the log and the status.
//
// mu is a leaf lock: nothing else is locked while it is held.
type Follower struct {
	cfg Config
	// role asks a server for its ROLE; recovered tells the dialer that
	// the errors it saw were the old primary's.
	role      func(ctx context.Context, addr string) (string, error)
	recovered func()
	log       *zap.Logger
	clients   []*redis.SentinelClient
	subs      []*redis.PubSub

	switched chan struct{} // a +switch-master was seen: ask now
	wake     chan struct{} // something looks wrong: ask soon
	readonly atomic.Bool   // a -READONLY reply was seen: ask the primary too
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu        sync.Mutex
	addr      string // the primary; "" when none is known
	epoch     int64  // the Sentinels' config-epoch of addr
	last      string // the last primary adopted, to count failovers
	hint      string // the new primary a +switch-master named
	gen       uint64 // changes whenever addr does
	conns     map[*TrackedConn]struct{}
	failovers uint64
	// failSign is when a failover was last seen starting or going on;
	// failTimeout the Sentinels' failover-timeout, which bounds it.
	failSign    time.Time
	failTimeout time.Duration
	answering   int
	silent      time.Time // no Sentinel answered since
	since       time.Time
	reason      string
}

func NewFollower(cfg Config, log *zap.Logger, role func(ctx context.Context, addr string) (string, error), recovered func()) *Follower {
	f := &Follower{
		cfg:       cfg,
		role:      role,
		recovered: recovered,
		log:       log,
		switched:  make(chan struct{}, 1),
		wake:      make(chan struct{}, 1),
		conns:     make(map[*TrackedConn]struct{}),
		reason:    "the Sentinels have not been asked yet",
		since:     time.Now(),
	}
	for _, a := range cfg.Addrs {
		f.clients = append(f.clients, redis.NewSentinelClient(&redis.Options{
			Addr:            a,
			Username:        cfg.Username,
			Password:        cfg.Password,
			TLSConfig:       cfg.TLS,
			Protocol:        2,
			DisableIdentity: true,
			DialTimeout:     cfg.Timeout,
			ReadTimeout:     cfg.Timeout,
			WriteTimeout:    cfg.Timeout,
			MaxRetries:      -1,
			PoolSize:        2,
		}))
	}
	return f
}

// start subscribes to every Sentinel's +switch-master and starts polling;
// close stops both and waits for them.
func (f *Follower) Start(ctx context.Context) {
	ctx, f.cancel = context.WithCancel(ctx)
	for _, c := range f.clients {
		// Subscribe does not fail: go-redis connects, and reconnects
		// and subscribes again, in the background.
		ps := c.Subscribe(ctx, eventSwitch, eventTry, "-failover-abort-not-elected",
			"-failover-abort-no-good-slave", "-failover-abort-slave-timeout")
		f.subs = append(f.subs, ps)
		f.wg.Add(1)
		go f.watch(ps.Channel(redis.WithChannelHealthCheckInterval(5 * time.Second)))
	}
	f.wg.Add(1)
	go f.run(ctx)
}

func (f *Follower) Close() {
	f.cancel()
	for _, ps := range f.subs {
		ps.Close() // ends the channel, and watch
	}
	f.wg.Wait()
	for _, c := range f.clients {
		c.Close()
	}
	f.mu.Lock()
	conns := f.takeConns()
	f.mu.Unlock()
	for _, c := range conns {
		c.Conn.Close()
	}
}

// The Sentinel events the follower acts on.
const (
	// eventSwitch: "<master-name> <old-ip> <old-port> <new-ip> <new-port>".
	eventSwitch = "+switch-master"
	// eventTry, a Sentinel starts a failover: "master <master-name> <ip>
	// <port> ...". The old primary stays writable until it is turned into
	// a replica, seconds after the new one was promoted; what it accepts
	// meanwhile is lost. So the proxy stops forwarding here, and clients
	// get errors instead of lost writes until the switch.
	eventTry = "+try-failover"
)

// watch acts on one Sentinel's events: a switch or the start of a
// failover drops the primary at once; an abort asks for a poll, which
// takes the primary back when no failover is in progress.
func (f *Follower) watch(msgs <-chan *redis.Message) {
	defer f.wg.Done()
	for m := range msgs {
		fields := strings.Fields(m.Payload)
		switch {
		case m.Channel == eventSwitch && len(fields) == 5 && fields[0] == f.cfg.MasterName:
			to := net.JoinHostPort(fields[3], fields[4])
			f.mu.Lock()
			if f.addr != to {
				f.hint = to
			}
			f.mu.Unlock()
			f.drop(to, "a Sentinel announced a switch to "+to)
		case m.Channel == eventTry && len(fields) >= 4 && fields[0] == "master" && fields[1] == f.cfg.MasterName:
			f.mu.Lock()
			f.failSign = time.Now()
			f.mu.Unlock()
			// Whichever primary it names: a Sentinel that has not heard
			// of an earlier failover may fail over the primary before it,
			// and its promotion would then demote the current one.
			f.drop("", "a Sentinel started a failover of "+net.JoinHostPort(fields[2], fields[3]))
		case len(fields) >= 2 && fields[0] == "master" && fields[1] == f.cfg.MasterName:
			// -failover-abort-*: a poll tells whether another goes on.
		default:
			continue
		}
		select {
		case f.switched <- struct{}{}:
		default:
		}
	}
}

// trouble asks for a poll soon: a backend connection was lost, a dial
// failed, or (readonly) the backend answered -READONLY, which a primary
// never does.
func (f *Follower) Trouble(readonly bool) {
	if readonly {
		f.readonly.Store(true)
	}
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// minGap spaces out polls that trouble asks for; a lost primary makes
// every client's connection report it at once.
const minGap = 100 * time.Millisecond

// run polls the Sentinels at start, every CheckInterval, every minGap
// while no primary is known, at once after a +switch-master, and after
// trouble no sooner than minGap after the last poll.
func (f *Follower) run(ctx context.Context) {
	defer f.wg.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-f.switched:
		case <-f.wake:
			if d := minGap - time.Since(last); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-f.switched:
				case <-time.After(d):
				}
			}
		}
		f.refresh(ctx)
		last = time.Now()
		next := f.cfg.CheckInterval
		if f.Status().Primary == "" {
			next = minGap
		}
		timer.Reset(next)
	}
}

// answer is one Sentinel's view of the primary.
type answer struct {
	addr  string
	epoch int64
	// failing: this Sentinel is failing the primary over.
	failing bool
	// timeout is the Sentinel's failover-timeout.
	timeout time.Duration
	err     error
}

// refresh asks every Sentinel for the primary and acts on the answers.
func (f *Follower) refresh(ctx context.Context) {
	f.mu.Lock()
	hint, hintEpoch := f.hint, f.epoch
	f.mu.Unlock()
	if hint != "" {
		// A Sentinel announced the switch: confirm the new primary
		// without waiting for every Sentinel. The next poll brings its
		// config-epoch.
		if role, err := f.role(ctx, hint); err == nil && role == "master" {
			f.adopt(hint, hintEpoch)
			return
		}
	}
	answers := f.askAll(ctx)
	best, answering, failing := choose(answers)
	readonly := f.readonly.Swap(false)

	f.mu.Lock()
	f.noteAnswers(answering, answers)
	cur, curEpoch, hint := f.addr, f.epoch, f.hint
	for _, a := range answers {
		f.failTimeout = max(f.failTimeout, a.timeout)
	}
	if failing {
		f.failSign = time.Now()
	} else if answering == len(answers) {
		f.failSign = time.Time{} // every Sentinel says no failover goes on
	}
	// After a sign of a failover, the same primary is taken back only
	// when every Sentinel says none goes on (one that does not answer may
	// be the one promoting a replica), or after the failover-timeout.
	unsure := !f.failSign.IsZero() && time.Since(f.failSign) < cmp.Or(f.failTimeout, 3*time.Minute)
	f.mu.Unlock()

	// A Sentinel's config-epoch grows with every failover it learns
	// of: an answer naming another primary at no newer an epoch than the
	// one adopted comes from a Sentinel that has not heard of a failover
	// yet, and a +switch-master is newer than any such answer.
	newer := best.addr != "" && best.epoch > curEpoch
	switch {
	case best.addr == cur && cur != "":
		f.raiseEpoch(best.epoch)
		if !readonly {
			return
		}
	case hint != "" && !newer:
		best = answer{addr: hint, epoch: curEpoch}
	case failing && !newer:
		// The primary the proxy used is being failed over, and no newer
		// one is known yet.
		f.drop("", "a Sentinel is failing the primary over")
		return
	case best.addr == "" || best.epoch < curEpoch || (cur != "" && !newer):
		return
	case !newer && unsure:
		f.setReason("a failover may be in progress: waiting for every Sentinel to answer")
		return
	}
	if best.addr != cur {
		f.drop(best.addr, "the Sentinels name "+best.addr)
	}
	role, err := f.role(ctx, best.addr)
	switch {
	case err != nil && best.addr == cur:
		// The primary may be down; keep it until the Sentinels name
		// another: its connections fail meanwhile anyway.
		return
	case err != nil:
		f.setReason(fmt.Sprintf("the Sentinels name %s, which does not answer: %v", best.addr, err))
	case role != "master":
		f.drop("", fmt.Sprintf("the Sentinels name %s, whose ROLE is %s", best.addr, role))
	default:
		f.adopt(best.addr, best.epoch)
	}
}

// askAll asks every Sentinel at once and waits for all answers, each
// bounded by Timeout.
func (f *Follower) askAll(ctx context.Context) []answer {
	answers := make([]answer, len(f.clients))
	var wg sync.WaitGroup
	for i, c := range f.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
			defer cancel()
			answers[i] = f.ask(actx, c)
		}()
	}
	wg.Wait()
	return answers
}

// ask asks one Sentinel for the primary: the config-epoch first (SENTINEL
// MASTER), then the address (SENTINEL GET-MASTER-ADDR-BY-NAME), so that a
// failover between the two makes the epoch too old rather than too new.
func (f *Follower) ask(ctx context.Context, c *redis.SentinelClient) answer {
	m, err := c.Master(ctx, f.cfg.MasterName).Result()
	if err != nil {
		return answer{err: err}
	}
	epoch, _ := strconv.ParseInt(m["config-epoch"], 10, 64)
	failing := slices.Contains(strings.Split(m["flags"], ","), "failover_in_progress")
	ms, _ := strconv.ParseInt(m["failover-timeout"], 10, 64)
	a, err := c.GetMasterAddrByName(ctx, f.cfg.MasterName).Result()
	if err != nil {
		return answer{err: err}
	}
	if len(a) != 2 {
		return answer{err: fmt.Errorf("get-master-addr-by-name answered %q", a)}
	}
	return answer{addr: net.JoinHostPort(a[0], a[1]), epoch: epoch, failing: failing, timeout: time.Duration(ms) * time.Millisecond}
}

// choose returns the answer with the highest epoch, the one most
// Sentinels gave among those, how many Sentinels answered at all, and
// whether one of them is failing the primary over.
func choose(answers []answer) (best answer, answering int, failing bool) {
	votes := make(map[answer]int)
	for _, a := range answers {
		if a.err == nil {
			answering++
			failing = failing || a.failing
			votes[answer{addr: a.addr, epoch: a.epoch}]++
		} else if !errors.Is(a.err, context.Canceled) && !isNetError(a.err) {
			answering++ // it answered, with an error
		}
	}
	n := 0
	for a, v := range votes {
		if a.epoch > best.epoch || (a.epoch == best.epoch && (v > n || (v == n && a.addr < best.addr))) {
			best, n = a, v
		}
	}
	return best, answering, failing
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded)
}

// noteAnswers records how many Sentinels answered, logging when none does
// any more and when one does again; f.mu is held.
func (f *Follower) noteAnswers(answering int, answers []answer) {
	switch {
	case answering == 0 && f.silent.IsZero():
		f.silent = time.Now()
		var errs []error
		for i, a := range answers {
			errs = append(errs, fmt.Errorf("%s: %w", f.cfg.Addrs[i], a.err))
		}
		f.log.Warn("no Sentinel answers; keeping the last known primary",
			zap.String("primary", f.addr), zap.Error(errors.Join(errs...)))
	case answering > 0 && !f.silent.IsZero():
		f.silent = time.Time{}
		f.log.Info("Sentinels answer again", zap.Int("answering", answering))
	}
	f.answering = answering
}

// drop stops using the current primary unless it is keep: every
// connection to it is closed before drop returns, and no new one is
// handed out until adopt.
func (f *Follower) drop(keep, reason string) {
	f.mu.Lock()
	old := f.addr
	if old == "" || old == keep {
		if old == "" {
			f.reason = reason
		}
		f.mu.Unlock()
		return
	}
	f.addr, f.reason, f.since = "", reason, time.Now()
	f.gen++
	conns := f.takeConns()
	f.mu.Unlock()
	for _, c := range conns {
		c.Conn.Close()
	}
	f.log.Warn("stopped forwarding to the backend primary", zap.String("primary", old),
		zap.String("reason", reason), zap.Int("connections_closed", len(conns)))
}

// adopt makes addr the primary.
func (f *Follower) adopt(addr string, epoch int64) {
	f.mu.Lock()
	if f.addr == addr {
		f.epoch = max(f.epoch, epoch)
		f.mu.Unlock()
		return
	}
	conns := f.takeConns() // of a primary dropped meanwhile: none
	prev := f.last
	f.addr, f.epoch, f.last, f.hint, f.reason, f.since = addr, epoch, addr, "", "", time.Now()
	f.gen++
	if prev != "" && prev != addr {
		f.failovers++
	}
	failovers := f.failovers
	f.mu.Unlock()
	for _, c := range conns {
		c.Conn.Close()
	}
	f.recovered() // the errors were the old primary's
	switch {
	case prev == "":
		f.log.Info("backend primary found", zap.String("primary", addr), zap.Int64("config_epoch", epoch))
	case prev == addr:
		f.log.Warn("forwarding to the backend primary again", zap.String("primary", addr))
	default:
		f.log.Warn("backend primary changed; following the failover", zap.String("from", prev),
			zap.String("to", addr), zap.Int64("config_epoch", epoch), zap.Uint64("failovers", failovers))
	}
}

// raiseEpoch records a newer config-epoch of the current primary.
func (f *Follower) raiseEpoch(epoch int64) {
	f.mu.Lock()
	f.epoch = max(f.epoch, epoch)
	f.mu.Unlock()
}

func (f *Follower) setReason(reason string) {
	f.mu.Lock()
	if f.addr == "" {
		f.reason = reason
	}
	f.mu.Unlock()
}

// takeConns empties the set of connections; f.mu is held.
func (f *Follower) takeConns() []*TrackedConn {
	conns := make([]*TrackedConn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	clear(f.conns)
	return conns
}

// target returns the address to dial and its generation.
func (f *Follower) Target() (string, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.addr == "" {
		return "", 0, fmt.Errorf("%w for master %q: %s", ErrNoPrimary, f.cfg.MasterName, f.reason)
	}
	return f.addr, f.gen, nil
}

// track registers nc, dialled to the address of generation gen, so that
// a change of primary closes it, and returns the connection to use in its
// place; it fails when the primary has changed since.
func (f *Follower) Track(nc net.Conn, gen uint64) (net.Conn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if gen != f.gen {
		return nil, errors.New("the primary changed while connecting")
	}
	tc := &TrackedConn{Conn: nc, f: f}
	f.conns[tc] = struct{}{}
	return tc, nil
}

func (f *Follower) Status() Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Status{
		Primary:              f.addr,
		Failovers:            f.failovers,
		Sentinel:             true,
		Sentinels:            len(f.clients),
		SentinelsAnswering:   f.answering,
		SentinelsSilentSince: f.silent,
		Since:                f.since,
		Reason:               f.reason,
	}
}

// trackedConn is a backend connection a follower closes when the primary
// changes. Only Close differs: the backend's reader and writer use the
// connection underneath.
type TrackedConn struct {
	net.Conn
	f *Follower
}

func (c *TrackedConn) Close() error {
	c.f.mu.Lock()
	delete(c.f.conns, c)
	c.f.mu.Unlock()
	return c.Conn.Close()
}

// errNoPrimary is the error of a command while the Sentinels name no
// primary the proxy could confirm.
var ErrNoPrimary = errors.New("no primary known")
