package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"gopkg.in/yaml.v3"

	"github.com/lockproxy/lockproxy/commands"
	"github.com/lockproxy/lockproxy/proxy"
	"github.com/lockproxy/lockproxy/quorum"
)

// fileConfig is config.yaml; the shipped file documents each key. The yaml
// tags live only here. A key left out of the file keeps its default (see
// defaultFileConfig); a key that is given is used as given. Fields tagged
// secret are masked by -print-config.
type fileConfig struct {
	Listen          string        `yaml:"listen"`
	TLS             serverTLS     `yaml:"tls"`
	Auth            authConfig    `yaml:"auth"`
	ArrivalOrder    bool          `yaml:"arrival_order"`
	ReadLoop        bool          `yaml:"read_loop"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	GOMAXPROCS      int           `yaml:"gomaxprocs"`
	Metrics         metricsConfig `yaml:"metrics"`
	Log             logConfig     `yaml:"log"`
	Backend         backendConfig `yaml:"backend"`
	Lock            lockConfig    `yaml:"lock"`
	Limits          limitsConfig  `yaml:"limits"`
}

type serverTLS struct {
	Enabled           bool   `yaml:"enabled"`
	CertFile          string `yaml:"cert_file"`
	KeyFile           string `yaml:"key_file" secret:"true"`
	ClientCAFile      string `yaml:"client_ca_file"`
	RequireClientCert bool   `yaml:"require_client_cert"`
}

type authConfig struct {
	Requirepass string            `yaml:"requirepass" secret:"true"`
	Users       map[string]string `yaml:"users" secret:"true"` // the passwords are secret
	// ACL are users with Redis's ACL rules, one aclfile line each
	// ("user alice on >pw ~app:* +@read +@lock"); ACLFile is a file of
	// such lines. BackendACL lets the backend's own ACL users sign in
	// too (implied by either).
	ACL        []string `yaml:"acl" secret:"true"`
	ACLFile    string   `yaml:"aclfile"`
	BackendACL bool     `yaml:"backend_acl"`
}

// aclUsers returns the ACL users: auth.acl's lines, then auth.aclfile's.
func (c *fileConfig) aclUsers() ([]string, error) {
	users := append([]string(nil), c.Auth.ACL...)
	if c.Auth.ACLFile == "" {
		return users, nil
	}
	b, err := os.ReadFile(c.Auth.ACLFile)
	if err != nil {
		return nil, fmt.Errorf("auth.aclfile: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			users = append(users, line)
		}
	}
	return users, nil
}

type metricsConfig struct {
	Listen string `yaml:"listen"`
}

type logConfig struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

type backendConfig struct {
	Addr              string        `yaml:"addr"`
	Cluster           []string      `yaml:"cluster,omitempty"`
	ClusterRetry      time.Duration `yaml:"cluster_retry"`
	Username          string        `yaml:"username"`
	Password          string        `yaml:"password" secret:"true"`
	DB                int           `yaml:"db"`
	DialTimeout       time.Duration `yaml:"dial_timeout"`
	WriteTimeout      time.Duration `yaml:"write_timeout"`
	SharedConnections connCount     `yaml:"shared_connections"`
	SpareConnections  int           `yaml:"spare_connections"`
	TLS               clientTLS     `yaml:"tls"`
	// Sentinel, instead of addr: the primary that Redis Sentinel names.
	Sentinel sentinelConfig `yaml:"sentinel"`
}

// sentinelConfig is backend.sentinel: how to find the backend's primary
// through Redis Sentinel. Username, password and TLS are the Sentinels'
// own; the backend's apply to the primary.
type sentinelConfig struct {
	MasterName    string        `yaml:"master_name"`
	Addrs         []string      `yaml:"addrs"`
	Username      string        `yaml:"username"`
	Password      string        `yaml:"password" secret:"true"`
	TLS           clientTLS     `yaml:"tls"`
	CheckInterval time.Duration `yaml:"check_interval"`
	Timeout       time.Duration `yaml:"timeout"`
}

// enabled reports whether any of the section's addressing keys is set.
func (s *sentinelConfig) enabled() bool { return s.MasterName != "" || len(s.Addrs) > 0 }

type lockConfig struct {
	Nodes          []string      `yaml:"nodes"`
	Username       string        `yaml:"username"`
	Password       string        `yaml:"password" secret:"true"`
	TLS            clientTLS     `yaml:"tls"`
	NodeTimeout    time.Duration `yaml:"node_timeout"`
	ClockTolerance time.Duration `yaml:"clock_tolerance"`
	DriftFactor    float64       `yaml:"drift_factor"`
	MaxTTL         time.Duration `yaml:"max_ttl"`
	MaxWait        time.Duration `yaml:"max_wait"`
	MaxResources   int           `yaml:"max_resources"`
	MaxPermits     int64         `yaml:"max_permits"`
	KeyPrefix      string        `yaml:"key_prefix"`
	GuardBackend   string        `yaml:"guard_backend"`
}

type limitsConfig struct {
	MaxClients      int           `yaml:"max_clients"`
	MaxBulkLen      int64         `yaml:"max_bulk_len"`
	MaxMultibulkLen int64         `yaml:"max_multibulk_len"`
	MaxInlineLen    int64         `yaml:"max_inline_len"`
	IdleTimeout     time.Duration `yaml:"idle_timeout"`
	CommandTimeout  time.Duration `yaml:"command_timeout"`
}

// clientTLS is how the proxy connects to the backend or the lock nodes.
type clientTLS struct {
	Enabled            bool   `yaml:"enabled"`
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file" secret:"true"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// embedded is the address that asks for an in-process Redis-compatible
// node instead of a real one.
const embedded = "embedded"

// defaultFileConfig is the configuration of an empty file. The settings
// that reach a package are that package's defaults, so each default is
// stated once, in the package's DefaultConfig; the rest are main's own.
func defaultFileConfig() fileConfig {
	q, c, p := quorum.DefaultConfig(), commands.DefaultConfig(), proxy.DefaultConfig()
	var f fileConfig
	f.Listen = "127.0.0.1:6380"
	f.ShutdownTimeout = 10 * time.Second
	f.ArrivalOrder = p.ArrivalOrder
	f.ReadLoop = p.ReadLoop
	f.Log = logConfig{Level: "info", Format: "console"}
	f.Backend = backendConfig{
		DB:                p.Backend.DB,
		DialTimeout:       p.Backend.DialTimeout,
		WriteTimeout:      p.Backend.WriteTimeout,
		SharedConnections: autoConns,
		SpareConnections:  p.Backend.SpareConnections,
		ClusterRetry:      p.Backend.ClusterRetry,
		Sentinel: sentinelConfig{
			Addrs:         []string{}, // as the file and -print-config write it
			CheckInterval: p.Backend.Sentinel.CheckInterval,
			Timeout:       p.Backend.Sentinel.Timeout,
		},
	}
	f.Lock = lockConfig{
		NodeTimeout:    q.NodeTimeout,
		ClockTolerance: q.ClockTolerance,
		DriftFactor:    q.DriftFactor,
		KeyPrefix:      q.KeyPrefix,
		MaxTTL:         c.MaxTTL,
		MaxWait:        c.MaxWait,
		MaxResources:   c.MaxResources,
		MaxPermits:     c.MaxPermits,
		GuardBackend:   "auto",
	}
	f.Limits = limitsConfig{
		MaxClients:      p.MaxClients,
		MaxBulkLen:      p.MaxBulkLen,
		MaxMultibulkLen: p.MaxMultibulkLen,
		MaxInlineLen:    p.MaxInlineLen,
		IdleTimeout:     p.IdleTimeout,
		CommandTimeout:  p.CommandTimeout,
	}
	return f
}

// loadConfig decodes the file at path strictly over the defaults (an
// unknown key is an error) and then applies the overrides in order, each
// decoded by the same decoder into its field.
func loadConfig(path string, overrides []override) (*fileConfig, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cfg := defaultFileConfig()
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, o := range overrides {
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	return &cfg, nil
}

// validate reports every bad setting, joined: main's own rules here, each
// package's in its Config's Validate.
func (c *fileConfig) validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("listen is empty"))
	}
	before := len(errs)
	sentinel, cluster := c.Backend.Sentinel.enabled(), len(c.Backend.Cluster) > 0
	switch s := &c.Backend.Sentinel; {
	case c.Backend.Addr == "" && !sentinel && !cluster:
		errs = append(errs, errors.New("backend.addr is empty (an address, or \"embedded\"), and no backend.sentinel is set (nor backend.cluster)"))
	case c.Backend.Addr != "" && sentinel:
		errs = append(errs, fmt.Errorf("backend.addr (%q) and backend.sentinel are mutually exclusive: set backend.addr to \"\" to follow the Sentinels' primary, or remove backend.sentinel", c.Backend.Addr))
	case c.Backend.Addr != "" && cluster:
		errs = append(errs, fmt.Errorf("backend.addr (%q) and backend.cluster are mutually exclusive: set backend.addr to \"\" for a Redis Cluster, or remove backend.cluster", c.Backend.Addr))
	case sentinel && cluster:
		errs = append(errs, errors.New("backend.sentinel and backend.cluster are mutually exclusive: a Redis Cluster fails over by itself"))
	case s.enabled():
		if s.MasterName == "" {
			errs = append(errs, errors.New("backend.sentinel.master_name is empty (the name the Sentinels monitor the primary under)"))
		}
		if len(s.Addrs) == 0 {
			errs = append(errs, errors.New("backend.sentinel.addrs is empty (the Sentinels' host:port addresses)"))
		}
		for i, a := range s.Addrs {
			if _, _, err := net.SplitHostPort(strings.TrimSpace(a)); err != nil {
				errs = append(errs, fmt.Errorf("backend.sentinel.addrs[%d] %q: want host:port", i, a))
			}
		}
		if s.CheckInterval <= 0 || s.Timeout <= 0 {
			errs = append(errs, errors.New("backend.sentinel.check_interval and timeout must be positive"))
		}
	case len(c.Backend.Cluster) > 0:
		for i, a := range c.Backend.Cluster {
			if a = strings.TrimSpace(a); a == "" || a == embedded {
				errs = append(errs, fmt.Errorf("backend.cluster[%d] %q: want host:port of a cluster node", i, a))
			}
		}
		if c.Backend.DB != 0 {
			errs = append(errs, errors.New("backend.db must be 0 with backend.cluster (a Redis Cluster has only db 0)"))
		}
		if c.Lock.GuardBackend == "on" {
			errs = append(errs, errors.New("lock.guard_backend on is not supported with backend.cluster: keep the lock nodes out of the cluster"))
		}
		if c.Backend.ClusterRetry <= 0 {
			errs = append(errs, errors.New("backend.cluster_retry must be positive"))
		}
	}
	backendOK := len(errs) == before
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
	if _, err := parseLevel(c.Log.Level); err != nil {
		errs = append(errs, err)
	}
	if !slices.Contains([]string{"console", "json"}, c.Log.Format) {
		errs = append(errs, fmt.Errorf("log.format %q: want console or json", c.Log.Format))
	}
	if c.TLS.RequireClientCert && c.TLS.ClientCAFile == "" {
		errs = append(errs, errors.New("tls.require_client_cert needs tls.client_ca_file"))
	}
	if c.Limits.CommandTimeout > 0 && c.Limits.CommandTimeout <= c.Lock.MaxWait {
		// A LOCK ... WAIT as long as lock.max_wait allows would be cut
		// short by the command timeout: reject what cannot work.
		errs = append(errs, fmt.Errorf("limits.command_timeout (%v) must be longer than lock.max_wait (%v)",
			c.Limits.CommandTimeout, c.Lock.MaxWait))
	}
	errs = append(errs, c.quorumConfig().Validate(), c.commandsConfig().Validate())
	if backendOK {
		// Otherwise the proxy's check would repeat the backend's message
		// (it reports only its first error).
		errs = append(errs, c.proxyConfig().Validate())
	}
	return errors.Join(errs...)
}

// quorumConfig maps the lock section onto the lock engine's Config.
func (c *fileConfig) quorumConfig() quorum.Config {
	q := quorum.DefaultConfig()
	q.NodeTimeout = c.Lock.NodeTimeout
	q.ClockTolerance = c.Lock.ClockTolerance
	q.DriftFactor = c.Lock.DriftFactor
	q.KeyPrefix = c.Lock.KeyPrefix
	q.MaxTTL = c.Lock.MaxTTL
	return q
}

// commandsConfig maps the lock section onto the lock commands' Config.
func (c *fileConfig) commandsConfig() commands.Config {
	return commands.Config{MaxTTL: c.Lock.MaxTTL, MaxWait: c.Lock.MaxWait, MaxResources: c.Lock.MaxResources, MaxPermits: c.Lock.MaxPermits}
}

// proxyConfig maps the file onto the proxy's Config, except what needs the
// running program: the TLS configurations (read from files), the local
// commands, INFO and the key guard. Backend.Addr is the file's, which may
// still be "embedded".
func (c *fileConfig) proxyConfig() proxy.Config {
	p := proxy.DefaultConfig()
	b := c.Backend
	p.Backend.Addr = b.Addr
	p.Backend.Cluster = b.Cluster
	p.Backend.ClusterRetry = b.ClusterRetry
	p.Backend.Username, p.Backend.Password = b.Username, b.Password
	p.Backend.DB = b.DB
	p.Backend.DialTimeout, p.Backend.WriteTimeout = b.DialTimeout, b.WriteTimeout
	p.Backend.SharedConnections = b.SharedConnections.resolve()
	p.Backend.SpareConnections = b.SpareConnections
	if b.Sentinel.enabled() {
		s := &p.Backend.Sentinel
		s.MasterName = b.Sentinel.MasterName
		for _, a := range b.Sentinel.Addrs {
			s.Addrs = append(s.Addrs, strings.TrimSpace(a))
		}
		s.Username, s.Password = b.Sentinel.Username, b.Sentinel.Password
		s.CheckInterval, s.Timeout = b.Sentinel.CheckInterval, b.Sentinel.Timeout
	}
	p.ArrivalOrder = c.ArrivalOrder
	p.ReadLoop = c.ReadLoop
	p.Limits = c.clientLimits()
	p.CommandTimeout = c.Limits.CommandTimeout
	if c.Auth.Requirepass != "" || len(c.Auth.Users) > 0 {
		p.Users = make(map[string]string, len(c.Auth.Users)+1)
		for u, pw := range c.Auth.Users {
			p.Users[u] = pw
		}
		if c.Auth.Requirepass != "" {
			p.Users["default"] = c.Auth.Requirepass
		}
	}
	return p
}

// clientLimits are the limits a running proxy can change (SIGHUP).
func (c *fileConfig) clientLimits() proxy.Limits {
	return proxy.Limits{
		MaxClients:      c.Limits.MaxClients,
		MaxBulkLen:      c.Limits.MaxBulkLen,
		MaxMultibulkLen: c.Limits.MaxMultibulkLen,
		MaxInlineLen:    c.Limits.MaxInlineLen,
		IdleTimeout:     c.Limits.IdleTimeout,
	}
}

// connCount is backend.shared_connections: a number, or auto (autoConns).
type connCount int

// autoConns is "auto": one shared connection per thread running Go code.
const autoConns connCount = math.MinInt32

// resolve returns the number of connections: auto is the proxy's own
// default (proxy.BackendConfig.SharedConnections, one per thread), read
// once run has set the threads.
func (c connCount) resolve() int {
	if c == autoConns {
		return proxy.DefaultConfig().Backend.SharedConnections
	}
	return int(c)
}

// UnmarshalYAML takes a number, or auto.
func (c *connCount) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Value == "auto" {
		*c = autoConns
		return nil
	}
	var v int
	if err := n.Decode(&v); err != nil {
		// A TypeError, like the decoder's own: an override's error then
		// loses the line number (see withoutLines).
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: cannot unmarshal %q into a number of connections or auto", n.Line, n.Value)}}
	}
	*c = connCount(v)
	return nil
}

// MarshalYAML writes auto as the file does.
func (c connCount) MarshalYAML() (any, error) {
	if c == autoConns {
		return "auto", nil
	}
	return int(c), nil
}

// goDefaultProcs is Go's GOMAXPROCS before run changes it.
var goDefaultProcs = runtime.GOMAXPROCS(0)

// threads returns the GOMAXPROCS the proxy sets, or 0 to keep Go's own,
// goDefault (the CPUs, or the container's CPU limit). gomaxprocs: 0 with
// no GOMAXPROCS environment variable leaves one CPU of Go's default to the
// Redis the proxy usually runs beside, whose commands run on one thread:
// on a 2-CPU host shared with Redis and its clients, one thread forwards
// more commands per second, at a lower p99, than two, and locks nearly as
// fast (README.md, Performance). gomaxprocs or GOMAXPROCS set a number of
// their own.
func (c *fileConfig) threads(env []string, goDefault int) int {
	if c.GOMAXPROCS > 0 {
		return c.GOMAXPROCS
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return 0 // Go read it already
		}
	}
	return max(1, goDefault-1)
}

// configure loads the configuration the command line names, with the
// environment's and the flags' overrides, and validates it.
func configure(o options, env []string) (*fileConfig, error) {
	overrides, err := envOverrides(env)
	if err != nil {
		return nil, err
	}
	cfg, err := loadConfig(o.path, append(overrides, o.flags...))
	if err != nil {
		return nil, err
	}
	return cfg, cfg.validate()
}

// nodeOptions are the go-redis options of the lock nodes at addrs.
func (c *fileConfig) nodeOptions(addrs []string) ([]*redis.Options, error) {
	tlsCfg, err := c.Lock.TLS.build()
	if err != nil {
		return nil, fmt.Errorf("lock.tls: %w", err)
	}
	opts := make([]*redis.Options, len(addrs))
	for i, a := range addrs {
		opts[i] = &redis.Options{Addr: a, Username: c.Lock.Username, Password: c.Lock.Password, TLSConfig: tlsCfg}
		if strings.HasPrefix(a, "/") {
			opts[i].Network = "unix"
		}
	}
	return opts, nil
}

// guardPrefix is the key prefix the proxy must keep forwarded commands
// away from (lock.guard_backend), or "": "on" always guards, "auto" when
// the backend is one of the lock nodes.
func (c *fileConfig) guardPrefix(backend string, nodes []string) string {
	if c.Lock.GuardBackend == "on" || (c.Lock.GuardBackend == "auto" && sameNode(backend, nodes)) {
		return c.Lock.KeyPrefix
	}
	return ""
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
