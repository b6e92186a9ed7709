// Command lockproxy is a Redis endpoint that forwards every ordinary command
// to a backend Redis untouched and answers LOCK, UNLOCK and EXTEND itself,
// as Redlock across several independent lock nodes.
//
// main only wires. The files of package main:
//
//   - main.go: run, the steps from the command line to shutdown.
//   - config.go: config.yaml's format, its defaults (the packages' own), its
//     validation and its mapping onto the Configs of quorum, commands and
//     proxy.
//   - override.go: every key of the file as a flag (-set section.key=value)
//     and an environment variable (LOCKPROXY_SECTION_KEY), and
//     -print-config.
//   - tls.go: TLS configurations from certificate files.
//   - embedded.go: in-process nodes for "embedded" addresses.
//   - http.go: /metrics, /locks (lockspage), /healthz, /readyz and pprof.
//   - logging.go: the zap logger, and go-redis's log lines through it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/commands"
	"github.com/lockproxy/lockproxy/proxy"
	"github.com/lockproxy/lockproxy/quorum"
)

// version is set at build time: go build -ldflags "-X main.version=1.2.3".
var version = "dev"

func main() {
	err := run(context.Background(), process{
		args:   os.Args[1:],
		env:    os.Environ(),
		stdout: os.Stdout,
		stderr: os.Stderr,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockproxy:", err)
		os.Exit(1)
	}
}

// process is what run takes from the process it runs in; tests pass their
// own.
type process struct {
	args           []string
	env            []string // as os.Environ returns it
	stdout, stderr io.Writer
	// listening, when not nil, receives the address the proxy listens on.
	listening chan<- net.Addr
}

// run serves until ctx ends or SIGINT/SIGTERM arrives.
func run(ctx context.Context, pr process) error {
	opts, err := parseArgs(pr.args, pr.stderr)
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if opts.version {
		fmt.Fprintln(pr.stdout, "lockproxy", version)
		return nil
	}
	cfg, err := configure(opts, pr.env)
	if err != nil {
		return err
	}
	if opts.printConfig {
		return printConfig(pr.stdout, cfg)
	}

	logger, level, err := newLogger(cfg.Log)
	if err != nil {
		return err
	}
	defer logger.Sync()
	redis.SetLogger(redisLogger{logger.Named("go-redis")})
	if n := cfg.threads(pr.env, goDefaultProcs); n > 0 {
		runtime.GOMAXPROCS(n)
	}

	var nodes embeddedNodes
	defer nodes.close()
	backend, lockNodes, err := nodes.start(cfg)
	if err != nil {
		return err
	}
	if n := len(nodes.nodes); n > 0 {
		logger.Warn("running on embedded in-process nodes: for trying lockproxy out, not for production", zap.Int("embedded", n))
	}

	nodeOpts, err := cfg.nodeOptions(lockNodes)
	if err != nil {
		return err
	}
	locker, err := quorum.New(nodeOpts, cfg.quorumConfig(), logger.Named("quorum"))
	if err != nil {
		return err
	}
	defer locker.Close()

	cmds, err := commands.New(locker, cfg.commandsConfig(), logger.Named("commands"))
	if err != nil {
		return err
	}

	p, err := newProxy(cfg, backend, lockNodes, locker, cmds, logger)
	if err != nil {
		return err
	}

	if cfg.Metrics.Listen != "" {
		stopHTTP, err := serveHTTP(cfg.Metrics.Listen, logger, p, locker, cmds)
		if err != nil {
			return fmt.Errorf("metrics.listen: %w", err)
		}
		defer stopHTTP()
	}

	onHUP := func() error { return reload(opts, pr.env, level, p) }
	return serve(ctx, cfg, p, pr.listening, onHUP, logger)
}

// newProxy builds the proxy for cfg, answering the lock commands with cmds.
// backend and lockNodes are the resolved addresses.
func newProxy(cfg *fileConfig, backend string, lockNodes []string, locker *quorum.Locker, cmds *commands.Handler, logger *zap.Logger) (*proxy.Proxy, error) {
	pcfg := cfg.proxyConfig()
	pcfg.Backend.Addr = backend
	var err error
	if pcfg.Backend.TLS, err = cfg.Backend.TLS.build(); err != nil {
		return nil, fmt.Errorf("backend.tls: %w", err)
	}
	if pcfg.Backend.Sentinel.TLS, err = cfg.Backend.Sentinel.TLS.build(); err != nil {
		return nil, fmt.Errorf("backend.sentinel.tls: %w", err)
	}
	if pcfg.TLS, err = cfg.TLS.build(); err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	pcfg.ProtectedPrefix = cfg.guardPrefix(backend, lockNodes)
	if pcfg.ACL.Users, err = cfg.aclUsers(); err != nil {
		return nil, err
	}
	pcfg.ACL.Backend = cfg.Auth.BackendACL
	pcfg.ACL.LockCategories, pcfg.ACL.LockResources = commands.Categories(), commands.Resources
	pcfg.ACL.FilterListed = commands.FilterListed
	pcfg.IsLocal = cmds.Is
	pcfg.MayWait = cmds.MayWait
	pcfg.NewLocal = func() proxy.Local { return cmds.NewConn() }
	pcfg.Fencing = fencing(cmds)
	pcfg.Docs = &proxy.Docs{Names: commands.Names(), AppendInfo: commands.AppendCommandInfo, AppendDocs: commands.AppendCommandDocs}
	var p *proxy.Proxy
	started := time.Now()
	pcfg.Info = func() string { return infoSection(started, p, locker, cmds) }
	p, err = proxy.New(pcfg, logger.Named("proxy"))
	if err != nil {
		return nil, err
	}
	logger.Info("configured",
		zap.String("backend", backend),
		zap.String("sentinel_master", pcfg.Backend.Sentinel.MasterName),
		zap.Strings("sentinels", pcfg.Backend.Sentinel.Addrs),
		zap.Strings("backend_cluster", pcfg.Backend.Cluster),
		zap.Strings("lock_nodes", lockNodes),
		zap.Bool("guard_backend", pcfg.ProtectedPrefix != ""),
		zap.Bool("tls", pcfg.TLS != nil),
		zap.Bool("auth", len(pcfg.Users) > 0 || len(pcfg.ACL.Users) > 0 || pcfg.ACL.Backend),
		zap.Int("acl_users", len(pcfg.ACL.Users)),
		zap.Int("gomaxprocs", runtime.GOMAXPROCS(0)))
	return p, nil
}

// serve accepts clients on cfg.Listen until ctx ends or SIGINT/SIGTERM
// arrives, calls reload on SIGHUP, and then shuts the proxy down within
// shutdown_timeout.
func serve(ctx context.Context, cfg *fileConfig, p *proxy.Proxy, listening chan<- net.Addr, reload func() error, logger *zap.Logger) error {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	logger.Info("listening", zap.String("addr", ln.Addr().String()))
	if listening != nil {
		listening <- ln.Addr()
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln) }()

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
wait:
	for {
		select {
		case err := <-served:
			return err
		case <-ctx.Done():
			break wait
		case <-hup:
			if err := reload(); err != nil {
				logger.Warn("reload failed; keeping the running settings", zap.Error(err))
				continue
			}
			logger.Info("reloaded log level and limits")
		}
	}
	logger.Info("shutting down", zap.Duration("timeout", cfg.ShutdownTimeout))
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := p.Shutdown(sctx); err != nil {
		logger.Warn("shutdown cut short", zap.Error(err))
	}
	if err := <-served; err != nil {
		return err
	}
	logger.Info("stopped")
	return nil
}

// reload re-reads the configuration (file, environment, flags) on SIGHUP and
// applies what can change while running: the log level, the client
// limits and the rules of Redis's ACL users (auth.acl, auth.aclfile).
// Everything else (addresses, nodes, TLS, authentication, timeouts)
// needs a restart.
func reload(opts options, env []string, level zap.AtomicLevel, p *proxy.Proxy) error {
	cfg, err := configure(opts, env)
	if err != nil {
		return err
	}
	lvl, err := parseLevel(cfg.Log.Level)
	if err != nil {
		return err
	}
	if err := p.SetLimits(cfg.clientLimits()); err != nil {
		return err
	}
	users, err := cfg.aclUsers()
	if err != nil {
		return err
	}
	if len(users) > 0 || cfg.Auth.BackendACL {
		// Redis's ACL users: installed again, applying to signed-in
		// clients' next command.
		if err := p.SetACL(users); err != nil {
			return err
		}
	}
	level.SetLevel(lvl)
	return nil
}

// infoSection is the body of INFO lockproxy.
func infoSection(started time.Time, p *proxy.Proxy, locker *quorum.Locker, cmds *commands.Handler) string {
	ps := p.Stats()
	bs := p.Backend()
	up := locker.NodesUp()
	var b strings.Builder
	for _, kv := range []struct {
		k string
		v any
	}{
		{"version", version},
		{"uptime_in_seconds", int64(time.Since(started).Seconds())},
		{"lock_nodes", locker.Nodes()},
		{"lock_nodes_up", up},
		{"lock_nodes_down", locker.Nodes() - up},
		{"connected_clients", ps.Clients},
		{"total_connections_received", ps.Connections},
		{"commands_forwarded", ps.Forwarded},
		{"forward_errors", ps.ForwardErrors},
		{"backend_primary", bs.Primary},
		{"backend_failovers", bs.Failovers},
	} {
		fmt.Fprintf(&b, "%s:%v\r\n", kv.k, kv.v)
	}
	if bs.Sentinel {
		fmt.Fprintf(&b, "backend_sentinels:%d\r\nbackend_sentinels_answering:%d\r\nbackend_primary_since_ms:%d\r\n",
			bs.Sentinels, bs.SentinelsAnswering, bs.Since.UnixMilli())
		if bs.Reason != "" {
			fmt.Fprintf(&b, "backend_primary_unknown_reason:%s\r\n", strings.NewReplacer("\r", " ", "\n", " ").Replace(bs.Reason))
		}
	}
	recovering := 0
	for _, st := range locker.Status() {
		if st.State == quorum.NodeRecovering {
			recovering++
		}
	}
	fmt.Fprintf(&b, "lock_nodes_recovering:%d\r\n", recovering)
	for _, st := range locker.Status() {
		fmt.Fprintf(&b, "lock_node%d:addr=%s,state=%s", st.Index, st.Addr, st.State)
		if !st.Until.IsZero() {
			fmt.Fprintf(&b, ",counts_again_by_ms=%d", st.Until.UnixMilli())
		}
		if st.Reason != "" {
			// INFO fields are split at commas and line ends.
			fmt.Fprintf(&b, ",reason=%s", strings.NewReplacer(",", ";", "\r", " ", "\n", " ").Replace(st.Reason))
		}
		b.WriteString("\r\n")
	}
	return b.String() + cmds.Info()
}

// fencing wires FENCED: cmds parses its arguments and counts its
// outcomes, the proxy runs it on the backend.
func fencing(cmds *commands.Handler) *proxy.Fencing {
	return &proxy.Fencing{
		Parse: func(args [][]byte) (proxy.FencedRequest, error) {
			f, err := cmds.ParseFenced(args)
			return proxy.FencedRequest{Resource: f.Resource, Fence: f.Fence, Slot: f.Slot, Command: f.Command}, err
		},
		Done: func(o proxy.FencedOutcome) {
			switch o {
			case proxy.FencedAccepted:
				cmds.CountFenced(commands.FencedAccepted)
			case proxy.FencedStale:
				cmds.CountFenced(commands.FencedStale)
			case proxy.FencedError:
				cmds.CountFenced(commands.FencedError)
			default:
				cmds.CountFenced(commands.FencedBadRequest)
			}
		},
	}
}
