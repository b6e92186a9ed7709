// Command lockproxy is a Redis endpoint that forwards every ordinary command
// to a backend Redis untouched and answers LOCK, UNLOCK and EXTEND itself,
// as Redlock across several independent lock nodes.
//
// main only wires: it reads config.yaml (flags override it), builds the
// logger, starts embedded nodes when the configuration asks for them,
// constructs quorum, commands and proxy, serves, and shuts down on SIGINT or
// SIGTERM.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"gopkg.in/yaml.v3"

	"github.com/lockproxy/lockproxy/commands"
	"github.com/lockproxy/lockproxy/proxy"
	"github.com/lockproxy/lockproxy/quorum"
)

// version is set at build time: go build -ldflags "-X main.version=1.2.3".
var version = "dev"

// embedded is the address that asks for an in-process Redis-compatible
// node instead of a real one.
const embedded = "embedded"

// fileConfig is config.yaml. See the shipped file for what each key means.
type fileConfig struct {
	Listen          string        `yaml:"listen"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	GOMAXPROCS      int           `yaml:"gomaxprocs"`
	TLS             struct {
		Enabled           bool   `yaml:"enabled"`
		CertFile          string `yaml:"cert_file"`
		KeyFile           string `yaml:"key_file"`
		ClientCAFile      string `yaml:"client_ca_file"`
		RequireClientCert bool   `yaml:"require_client_cert"`
	} `yaml:"tls"`
	Auth struct {
		Requirepass string            `yaml:"requirepass"`
		Users       map[string]string `yaml:"users"`
	} `yaml:"auth"`
	Metrics struct {
		Listen string `yaml:"listen"`
	} `yaml:"metrics"`
	Log struct {
		Level  string `yaml:"level"`
		Format string `yaml:"format"`
	} `yaml:"log"`
	Backend struct {
		Addr              string        `yaml:"addr"`
		Username          string        `yaml:"username"`
		Password          string        `yaml:"password"`
		DB                int           `yaml:"db"`
		DialTimeout       time.Duration `yaml:"dial_timeout"`
		WriteTimeout      time.Duration `yaml:"write_timeout"`
		SharedConnections int           `yaml:"shared_connections"`
		TLS               tlsConfig     `yaml:"tls"`
	} `yaml:"backend"`
	Lock struct {
		Nodes        []string      `yaml:"nodes"`
		Username     string        `yaml:"username"`
		Password     string        `yaml:"password"`
		TLS          tlsConfig     `yaml:"tls"`
		NodeTimeout  time.Duration `yaml:"node_timeout"`
		DriftFactor  float64       `yaml:"drift_factor"`
		MaxTTL       time.Duration `yaml:"max_ttl"`
		MaxWait      time.Duration `yaml:"max_wait"`
		KeyPrefix    string        `yaml:"key_prefix"`
		GuardBackend string        `yaml:"guard_backend"`
	} `yaml:"lock"`
	Limits struct {
		MaxClients      int           `yaml:"max_clients"`
		MaxBulkLen      int64         `yaml:"max_bulk_len"`
		MaxMultibulkLen int64         `yaml:"max_multibulk_len"`
		MaxInlineLen    int64         `yaml:"max_inline_len"`
		IdleTimeout     time.Duration `yaml:"idle_timeout"`
		CommandTimeout  time.Duration `yaml:"command_timeout"`
	} `yaml:"limits"`
}

type tlsConfig struct {
	Enabled            bool   `yaml:"enabled"`
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

func main() {
	if err := run(context.Background(), os.Args[1:], nil); err != nil {
		fmt.Fprintln(os.Stderr, "lockproxy:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends or SIGINT/SIGTERM arrives. When listening is
// not nil it receives the address the proxy listens on.
func run(ctx context.Context, args []string, listening chan<- net.Addr) error {
	cfg, err := configure(args)
	if errors.Is(err, errVersion) {
		fmt.Println("lockproxy", version)
		return nil
	}
	if err != nil {
		return err
	}
	level := zap.NewAtomicLevel()
	logger, err := newLogger(cfg.Log.Level, cfg.Log.Format, level)
	if err != nil {
		return err
	}
	defer logger.Sync()
	if cfg.GOMAXPROCS > 0 {
		runtime.GOMAXPROCS(cfg.GOMAXPROCS)
	}

	var nodes embeddedNodes
	defer nodes.close()
	backendAddr, err := nodes.resolve(cfg.Backend.Addr)
	if err != nil {
		return err
	}
	lockAddrs := make([]string, len(cfg.Lock.Nodes))
	for i, a := range cfg.Lock.Nodes {
		if lockAddrs[i], err = nodes.resolve(a); err != nil {
			return err
		}
	}
	if len(nodes.nodes) > 0 {
		logger.Warn("running on embedded in-process nodes: for trying lockproxy out, not for production",
			zap.Int("embedded", len(nodes.nodes)))
		nodes.tick()
	}

	lockTLS, err := cfg.Lock.TLS.build()
	if err != nil {
		return fmt.Errorf("lock.tls: %w", err)
	}
	nodeOpts := make([]*redis.Options, len(lockAddrs))
	for i, a := range lockAddrs {
		nodeOpts[i] = &redis.Options{Addr: a, Username: cfg.Lock.Username, Password: cfg.Lock.Password, TLSConfig: lockTLS}
		if strings.HasPrefix(a, "/") {
			nodeOpts[i].Network = "unix"
		}
	}
	qcfg := quorum.DefaultConfig()
	setIf(&qcfg.NodeTimeout, cfg.Lock.NodeTimeout)
	setIf(&qcfg.DriftFactor, cfg.Lock.DriftFactor)
	setIf(&qcfg.KeyPrefix, cfg.Lock.KeyPrefix)
	locker, err := quorum.New(nodeOpts, qcfg, logger.Named("quorum"))
	if err != nil {
		return err
	}
	defer locker.Close()

	ccfg := commands.DefaultConfig()
	setIf(&ccfg.MaxTTL, cfg.Lock.MaxTTL)
	setIf(&ccfg.MaxWait, cfg.Lock.MaxWait)
	cmds, err := commands.New(locker, ccfg, logger.Named("commands"))
	if err != nil {
		return err
	}

	pcfg := proxy.DefaultConfig()
	pcfg.Backend.Addr = backendAddr
	pcfg.Backend.Username = cfg.Backend.Username
	pcfg.Backend.Password = cfg.Backend.Password
	pcfg.Backend.DB = cfg.Backend.DB
	setIf(&pcfg.Backend.DialTimeout, cfg.Backend.DialTimeout)
	setIf(&pcfg.Backend.WriteTimeout, cfg.Backend.WriteTimeout)
	setIf(&pcfg.Backend.SharedConnections, cfg.Backend.SharedConnections)
	if pcfg.Backend.TLS, err = cfg.Backend.TLS.build(); err != nil {
		return fmt.Errorf("backend.tls: %w", err)
	}
	pcfg.Limits = cfg.clientLimits()
	pcfg.CommandTimeout = ccfg.MaxWait + 30*time.Second
	setIf(&pcfg.CommandTimeout, cfg.Limits.CommandTimeout)
	if pcfg.TLS, err = cfg.serverTLS(); err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	if cfg.Auth.Requirepass != "" || len(cfg.Auth.Users) > 0 {
		pcfg.Users = map[string]string{}
		for u, pw := range cfg.Auth.Users {
			pcfg.Users[u] = pw
		}
		if cfg.Auth.Requirepass != "" {
			pcfg.Users["default"] = cfg.Auth.Requirepass
		}
	}
	var p *proxy.Proxy
	started := time.Now()
	pcfg.Info = func() string { return infoSection(started, p, locker, cmds) }
	pcfg.Docs = &proxy.Docs{Names: commands.Names(), AppendInfo: commands.AppendCommandInfo, AppendDocs: commands.AppendCommandDocs}
	pcfg.IsLocal = cmds.Is
	pcfg.MayWait = cmds.MayWait
	pcfg.NewLocal = func() proxy.Local { return cmds.NewConn() }
	switch cfg.Lock.GuardBackend {
	case "on":
		pcfg.ProtectedPrefix = qcfg.KeyPrefix
	case "auto":
		if sameNode(backendAddr, lockAddrs) {
			pcfg.ProtectedPrefix = qcfg.KeyPrefix
		}
	}
	p, err = proxy.New(pcfg, logger.Named("proxy"))
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

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	logger.Info("listening",
		zap.String("addr", ln.Addr().String()),
		zap.String("backend", backendAddr),
		zap.Strings("lock_nodes", lockAddrs),
		zap.Bool("guard_backend", pcfg.ProtectedPrefix != ""),
		zap.Bool("tls", pcfg.TLS != nil),
		zap.Bool("auth", len(pcfg.Users) > 0),
		zap.Int("gomaxprocs", runtime.GOMAXPROCS(0)))
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
			if err := reload(args, level, p); err != nil {
				logger.Warn("reload failed; keeping the running settings", zap.Error(err))
				continue
			}
			logger.Info("reloaded log level and limits", zap.Stringer("level", level.Level()))
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

// serveHTTP serves /metrics, /healthz (the process is alive) and /readyz
// (the backend answers and a majority of lock nodes answer) on addr. The
// returned function stops the server and waits for it.
func serveHTTP(addr string, logger *zap.Logger, p *proxy.Proxy, locker *quorum.Locker, cmds *commands.Handler) (func(), error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), p, locker, cmds)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Profiles for finding where the proxy spends its time (go tool pprof
	// http://ADDR/debug/pprof/profile); keep metrics.listen on loopback.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := errors.Join(p.Ready(ctx), locker.Ready(ctx)); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Warn("metrics server stopped", zap.Error(err))
		}
	}()
	logger.Info("serving metrics", zap.String("addr", ln.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	}, nil
}

// infoSection is the body of INFO lockproxy.
func infoSection(started time.Time, p *proxy.Proxy, locker *quorum.Locker, cmds *commands.Handler) string {
	ps := p.Stats()
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
	} {
		fmt.Fprintf(&b, "%s:%v\r\n", kv.k, kv.v)
	}
	return b.String() + cmds.Info()
}

// clientLimits are the proxy's defaults with the file's limits over them;
// start-up and SIGHUP both use it.
func (c *fileConfig) clientLimits() proxy.Limits {
	l := proxy.DefaultConfig().Limits
	setIf(&l.MaxClients, c.Limits.MaxClients)
	setIf(&l.MaxBulkLen, c.Limits.MaxBulkLen)
	setIf(&l.MaxMultibulkLen, c.Limits.MaxMultibulkLen)
	setIf(&l.MaxInlineLen, c.Limits.MaxInlineLen)
	l.IdleTimeout = c.Limits.IdleTimeout
	return l
}

// errVersion asks run to print the version.
var errVersion = errors.New("version requested")

// reload re-reads the configuration on SIGHUP and applies what can change
// while running: the log level and the client limits. Everything else
// (addresses, nodes, TLS, authentication, timeouts) needs a restart.
func reload(args []string, level zap.AtomicLevel, p *proxy.Proxy) error {
	cfg, err := configure(args)
	if err != nil {
		return err
	}
	lvl, err := zapcore.ParseLevel(cfg.Log.Level)
	if err != nil {
		return fmt.Errorf("log.level: %w", err)
	}
	if err := p.SetLimits(cfg.clientLimits()); err != nil {
		return err
	}
	level.SetLevel(lvl)
	return nil
}

// configure reads the config file named by -config and applies the flags
// over it.
func configure(args []string) (*fileConfig, error) {
	fs := flag.NewFlagSet("lockproxy", flag.ContinueOnError)
	path := fs.String("config", "config.yaml", "configuration file")
	listen := fs.String("listen", "", "address to listen on (overrides listen)")
	backend := fs.String("backend", "", "backend Redis address (overrides backend.addr)")
	lockNodes := fs.String("lock-nodes", "", "comma-separated lock node addresses (overrides lock.nodes)")
	level := fs.String("log-level", "", "debug, info, warn or error (overrides log.level)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *showVersion {
		return nil, errVersion
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return nil, err
	}
	setIf(&cfg.Listen, *listen)
	setIf(&cfg.Backend.Addr, *backend)
	setIf(&cfg.Log.Level, *level)
	if *lockNodes != "" {
		cfg.Lock.Nodes = strings.Split(*lockNodes, ",")
	}
	return cfg, cfg.validate()
}

// loadConfig parses the file strictly: an unknown key is an error.
func loadConfig(path string) (*fileConfig, error) {
	cfg := &fileConfig{Listen: "127.0.0.1:6380", ShutdownTimeout: 10 * time.Second}
	cfg.Log.Level, cfg.Log.Format = "info", "console"
	cfg.Lock.GuardBackend = "auto"
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

func (c *fileConfig) validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("listen is empty"))
	}
	if c.Backend.Addr == "" {
		errs = append(errs, errors.New("backend.addr is empty (an address, or \"embedded\")"))
	}
	if len(c.Lock.Nodes) == 0 {
		errs = append(errs, errors.New("lock.nodes is empty"))
	}
	for i, n := range c.Lock.Nodes {
		if strings.TrimSpace(n) == "" {
			errs = append(errs, fmt.Errorf("lock.nodes[%d] is empty", i))
		}
	}
	if !slices.Contains([]string{"auto", "on", "off"}, c.Lock.GuardBackend) {
		errs = append(errs, fmt.Errorf("lock.guard_backend %q: want auto, on or off", c.Lock.GuardBackend))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("shutdown_timeout must be positive"))
	}
	if c.GOMAXPROCS < 0 {
		errs = append(errs, errors.New("gomaxprocs must not be negative"))
	}
	for name, d := range map[string]time.Duration{
		"backend.dial_timeout": c.Backend.DialTimeout, "backend.write_timeout": c.Backend.WriteTimeout,
		"lock.node_timeout": c.Lock.NodeTimeout, "lock.max_ttl": c.Lock.MaxTTL, "lock.max_wait": c.Lock.MaxWait,
		"limits.idle_timeout": c.Limits.IdleTimeout, "limits.command_timeout": c.Limits.CommandTimeout,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative", name))
		}
	}
	if c.Lock.DriftFactor < 0 || c.Lock.DriftFactor >= 1 {
		errs = append(errs, errors.New("lock.drift_factor must be in [0, 1)"))
	}
	if c.Backend.DB < 0 {
		errs = append(errs, errors.New("backend.db must not be negative"))
	}
	if c.Limits.MaxClients < 0 || c.Limits.MaxBulkLen < 0 || c.Limits.MaxMultibulkLen < 0 || c.Limits.MaxInlineLen < 0 {
		errs = append(errs, errors.New("limits must not be negative"))
	}
	return errors.Join(errs...)
}

// setIf sets *dst to v unless v is the zero value, which in the file means
// "use the default".
func setIf[T comparable](dst *T, v T) {
	var zero T
	if v != zero {
		*dst = v
	}
}

// newLogger builds the logger; its level is atomic so that SIGHUP can
// change it.
func newLogger(level, format string, atomic zap.AtomicLevel) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	atomic.SetLevel(lvl)
	var zc zap.Config
	switch format {
	case "json":
		zc = zap.NewProductionConfig()
	case "console":
		zc = zap.NewDevelopmentConfig()
		zc.Development = false
	default:
		return nil, fmt.Errorf("log.format %q: want console or json", format)
	}
	zc.Level = atomic
	zc.DisableStacktrace = true
	return zc.Build()
}

// serverTLS is the TLS configuration for clients, or nil.
func (c *fileConfig) serverTLS() (*tls.Config, error) {
	t := c.TLS
	if !t.Enabled {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCAFile != "" {
		if cfg.ClientCAs, err = certPool(t.ClientCAFile); err != nil {
			return nil, err
		}
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	if t.RequireClientCert {
		if cfg.ClientCAs == nil {
			return nil, errors.New("require_client_cert needs client_ca_file")
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// certPool reads the PEM certificates in path.
func certPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate found", path)
	}
	return pool, nil
}

func (c tlsConfig) build() (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	t := &tls.Config{ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		var err error
		if t.RootCAs, err = certPool(c.CAFile); err != nil {
			return nil, err
		}
	}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, err
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// sameNode reports whether the backend is one of the lock nodes, comparing
// resolved addresses so that localhost and 127.0.0.1 match.
func sameNode(backend string, nodes []string) bool {
	norm := func(a string) string {
		if t, err := net.ResolveTCPAddr("tcp", a); err == nil {
			return t.String()
		}
		return a
	}
	b := norm(backend)
	for _, n := range nodes {
		if norm(n) == b {
			return true
		}
	}
	return false
}

// embeddedNodes are in-process Redis-compatible servers (miniredis) for a
// configuration that names "embedded" instead of an address. Their owner
// calls close, which stops the clock goroutine and the servers.
type embeddedNodes struct {
	nodes []*miniredis.Miniredis
	stop  chan struct{}
	done  chan struct{}
}

func (e *embeddedNodes) resolve(addr string) (string, error) {
	addr = strings.TrimSpace(addr)
	if addr != embedded {
		return addr, nil
	}
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return "", fmt.Errorf("embedded node: %w", err)
	}
	e.nodes = append(e.nodes, m)
	return m.Addr(), nil
}

// tick starts advancing the embedded nodes' clocks: miniredis expires keys
// only when told that time has passed, and locks must expire.
func (e *embeddedNodes) tick() {
	e.stop, e.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(e.done)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-e.stop:
				return
			case now := <-t.C:
				for _, m := range e.nodes {
					m.SetTime(now)
					m.FastForward(now.Sub(last))
				}
				last = now
			}
		}
	}()
}

func (e *embeddedNodes) close() {
	if e.stop != nil {
		close(e.stop)
		<-e.done
	}
	for _, m := range e.nodes {
		m.Close()
	}
}
