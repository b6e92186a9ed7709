package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/commands"
	"github.com/lockproxy/lockproxy/proxy"
	"github.com/lockproxy/lockproxy/quorum"
)

// writeConfig writes a config file into a temporary directory.
func writeConfig(t testing.TB, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestOverrides: each kind of key set with -set lands in its field, decoded
// as the file would decode it.
func TestOverrides(t *testing.T) {
	tests := []struct {
		give string // the argument of -set
		got  func(c *fileConfig) any
		want any
	}{
		{give: "listen=127.0.0.1:7000", got: func(c *fileConfig) any { return c.Listen }, want: "127.0.0.1:7000"},
		{give: "metrics.listen=127.0.0.1:9381", got: func(c *fileConfig) any { return c.Metrics.Listen }, want: "127.0.0.1:9381"},
		{give: "metrics.listen=", got: func(c *fileConfig) any { return c.Metrics.Listen }, want: ""},
		{give: "lock.key_prefix=app:", got: func(c *fileConfig) any { return c.Lock.KeyPrefix }, want: "app:"},
		{give: "backend.password=p#w: 'x\"", got: func(c *fileConfig) any { return c.Backend.Password }, want: "p#w: 'x\""},
		{give: "backend.addr=/run/redis.sock", got: func(c *fileConfig) any { return c.Backend.Addr }, want: "/run/redis.sock"},
		{give: "lock.node_timeout=125ms", got: func(c *fileConfig) any { return c.Lock.NodeTimeout }, want: 125 * time.Millisecond},
		{give: "lock.max_ttl=2h", got: func(c *fileConfig) any { return c.Lock.MaxTTL }, want: 2 * time.Hour},
		{give: "lock.drift_factor=0.05", got: func(c *fileConfig) any { return c.Lock.DriftFactor }, want: 0.05},
		{give: "lock.clock_tolerance=80ms", got: func(c *fileConfig) any { return c.Lock.ClockTolerance }, want: 80 * time.Millisecond},
		{give: "backend.db=3", got: func(c *fileConfig) any { return c.Backend.DB }, want: 3},
		{give: "backend.shared_connections=-1", got: func(c *fileConfig) any { return c.Backend.SharedConnections }, want: connCount(-1)},
		{give: "backend.shared_connections=3", got: func(c *fileConfig) any { return c.Backend.SharedConnections }, want: connCount(3)},
		{give: "backend.shared_connections=auto", got: func(c *fileConfig) any { return c.Backend.SharedConnections }, want: autoConns},
		{give: "limits.max_bulk_len=1048576", got: func(c *fileConfig) any { return c.Limits.MaxBulkLen }, want: int64(1 << 20)},
		{give: "tls.enabled=true", got: func(c *fileConfig) any { return c.TLS.Enabled }, want: true},
		{give: "lock.tls.server_name=redis.internal", got: func(c *fileConfig) any { return c.Lock.TLS.ServerName }, want: "redis.internal"},
		{give: "lock.nodes=a:1,b:2, c:3", got: func(c *fileConfig) any { return c.Lock.Nodes }, want: []string{"a:1", "b:2", "c:3"}},
		{give: "lock.nodes=[a:1, b:2]", got: func(c *fileConfig) any { return c.Lock.Nodes }, want: []string{"a:1", "b:2"}},
		{give: "lock.nodes=embedded", got: func(c *fileConfig) any { return c.Lock.Nodes }, want: []string{"embedded"}},
		{give: "auth.users={alice: a1, bob: b2}", got: func(c *fileConfig) any { return c.Auth.Users }, want: map[string]string{"alice": "a1", "bob": "b2"}},
		{give: "auth.users.carol=c3", got: func(c *fileConfig) any { return c.Auth.Users }, want: map[string]string{"zoe": "z", "carol": "c3"}},
	}
	path := writeConfig(t, "backend: {addr: embedded}\nlock: {nodes: [x:1]}\nauth: {users: {zoe: z}}\n")
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			opts, err := parseArgs([]string{"-config", path, "-set", tt.give}, testWriter{t})
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := loadConfig(opts.path, opts.flags)
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			if got := tt.got(cfg); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("-set %s: got %#v, want %#v", tt.give, got, tt.want)
			}
		})
	}
}

// TestOverrideErrorsMatchFile: a bad value or key gets the same message
// from -set, from the environment and from the file.
func TestOverrideErrorsMatchFile(t *testing.T) {
	tests := []struct {
		key, value string
		file       string // the same setting in the file
		want       string
	}{
		{key: "lock.node_timeout", value: "fast", file: "lock: {node_timeout: fast}", want: "cannot unmarshal !!str `fast` into time.Duration"},
		{key: "backend.db", value: "one", file: "backend: {db: one}", want: "cannot unmarshal !!str `one` into int"},
		{key: "backend.shared_connections", value: "many", file: "backend: {shared_connections: many}", want: `cannot unmarshal "many" into a number of connections or auto`},
		{key: "tls.enabled", value: "maybe", file: "tls: {enabled: maybe}", want: "cannot unmarshal !!str `maybe` into bool"},
		{key: "lock.drift_factor", value: "[1]", file: "lock: {drift_factor: [1]}", want: "cannot unmarshal !!seq into float64"},
		{key: "lock.nodes", value: "{a: b}", file: "lock: {nodes: {a: b}}", want: "cannot unmarshal !!map into []string"},
		{key: "bakend.addr", value: "x", file: "bakend: {addr: x}", want: "field bakend not found in type main.fileConfig"},
		{key: "lock.nodez", value: "x", file: "lock: {nodez: x}", want: "field nodez not found in type main.lockConfig"},
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			_, fileErr := loadConfig(writeConfig(t, tt.file+"\n"), nil)
			_, setErr := loadConfig(writeConfig(t, ""), []override{{source: "-set " + tt.key, key: tt.key, value: tt.value}})
			errs := []error{fileErr, setErr}
			envs, err := envOverrides([]string{envName(tt.key) + "=" + tt.value})
			switch {
			case err == nil:
				_, err = loadConfig(writeConfig(t, ""), envs)
				errs = append(errs, err)
			case !strings.HasPrefix(err.Error(), envName(tt.key)+": no such key"):
				// Only a key the file lacks has no variable.
				t.Errorf("%s: %v", envName(tt.key), err)
			}
			for _, err := range errs {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("error %v, want one naming %q", err, tt.want)
				}
			}
			// Past the source (file name, flag or variable), the decoder's
			// words are the same.
			tail := func(err error) string {
				if err == nil {
					return ""
				}
				_, after, _ := strings.Cut(err.Error(), ": ")
				return regexp.MustCompile(`line \d+: `).ReplaceAllString(after, "")
			}
			if tail(setErr) != tail(fileErr) {
				t.Errorf("-set says %q, the file %q", tail(setErr), tail(fileErr))
			}
		})
	}
}

// TestOverrideKeyErrors: keys that hold no single value.
func TestOverrideKeyErrors(t *testing.T) {
	tests := []struct{ give, want string }{
		{give: "lock=x", want: "-set lock: lock is a section: set its keys one by one"},
		{give: "lock.tls=x", want: "-set lock.tls: lock.tls is a section: set its keys one by one"},
		{give: "listen.port=1", want: "-set listen.port: listen holds a value, not keys"},
		{give: "auth.users.a.b=1", want: "-set auth.users.a.b: auth.users holds a value, not keys"},
		{give: "=x", want: `invalid value "=x" for flag -set: "=x": want section.key=value`},
		{give: "listen", want: `invalid value "listen" for flag -set: "listen": want section.key=value`},
	}
	path := writeConfig(t, "")
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			opts, err := parseArgs([]string{"-config", path, "-set", tt.give}, testWriter{t})
			if err == nil {
				_, err = loadConfig(opts.path, opts.flags)
			}
			if err == nil || err.Error() != tt.want {
				t.Errorf("-set %s: %v, want %q", tt.give, err, tt.want)
			}
		})
	}
}

// TestEnvNames maps keys to variables and back.
func TestEnvNames(t *testing.T) {
	tests := []struct{ key, want string }{
		{key: "listen", want: "LOCKPROXY_LISTEN"},
		{key: "metrics.listen", want: "LOCKPROXY_METRICS_LISTEN"},
		{key: "lock.node_timeout", want: "LOCKPROXY_LOCK_NODE_TIMEOUT"},
		{key: "backend.tls.insecure_skip_verify", want: "LOCKPROXY_BACKEND_TLS_INSECURE_SKIP_VERIFY"},
		{key: "auth.users", want: "LOCKPROXY_AUTH_USERS"},
	}
	for _, tt := range tests {
		if got := envName(tt.key); got != tt.want {
			t.Errorf("envName(%s) = %s, want %s", tt.key, got, tt.want)
		}
		got, err := envOverrides([]string{tt.want + "=v", "PATH=/bin", "LOCKPROXYNOT=1"})
		if err != nil || len(got) != 1 || got[0].key != tt.key || got[0].value != "v" || got[0].source != tt.want {
			t.Errorf("envOverrides(%s=v) = %+v, %v, want key %s", tt.want, got, err, tt.key)
		}
	}
	// Every key has a variable of its own, and the file's keys are all
	// reachable: the shipped config.yaml names each of them.
	seen := map[string]string{}
	for _, k := range fileKeys() {
		if other, ok := seen[envName(k)]; ok {
			t.Errorf("keys %s and %s share the variable %s", k, other, envName(k))
		}
		seen[envName(k)] = k
	}
	if len(seen) < 40 {
		t.Errorf("only %d keys found: %v", len(seen), fileKeys())
	}
	const want = "LOCKPROXY_LOCK_NODE_TIMOUT: no such key in the configuration (LOCKPROXY_SECTION_KEY sets section.key)"
	if _, err := envOverrides([]string{"LOCKPROXY_LOCK_NODE_TIMOUT=1s"}); err == nil || err.Error() != want {
		t.Errorf("a misspelt variable: %v, want %q", err, want)
	}
}

// TestPrecedence: defaults < file < environment < flags, flags in order.
func TestPrecedence(t *testing.T) {
	path := writeConfig(t, "backend: {addr: embedded}\nlock: {nodes: [embedded], node_timeout: 100ms, max_ttl: 2h}\nlog: {level: warn}\n")
	env := []string{"LOCKPROXY_LOCK_NODE_TIMEOUT=200ms", "LOCKPROXY_LOG_LEVEL=error", "LOCKPROXY_LISTEN=127.0.0.1:7001"}
	opts, err := parseArgs([]string{"-config", path, "-log-level", "debug", "-set", "listen=127.0.0.1:7002", "-listen", "127.0.0.1:7003"}, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := configure(opts, env)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		what      string
		got, want any
	}{
		{"default (nothing sets it)", cfg.Lock.MaxWait, time.Minute},
		{"file over default", cfg.Lock.MaxTTL, 2 * time.Hour},
		{"environment over file", cfg.Lock.NodeTimeout, 200 * time.Millisecond},
		{"flag over environment and file", cfg.Log.Level, "debug"},
		{"the last flag", cfg.Listen, "127.0.0.1:7003"},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: %v, want %v", tt.what, tt.got, tt.want)
		}
	}
}

// TestDefaultsAreThePackages': the file's defaults are the packages'
// DefaultConfig, and the shipped config.yaml states them.
func TestDefaultsAreThePackages(t *testing.T) {
	def := defaultFileConfig()
	if got, want := def.quorumConfig(), quorum.DefaultConfig(); got != want {
		t.Errorf("quorum: %+v, want %+v", got, want)
	}
	if got, want := def.commandsConfig(), commands.DefaultConfig(); got != want {
		t.Errorf("commands: %+v, want %+v", got, want)
	}
	if got, want := def.proxyConfig(), proxy.DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("proxy: %+v, want %+v", got, want)
	}
	shipped, err := loadConfig("config.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	// The shipped file differs from the defaults in the addresses only.
	shipped.Backend.Addr, shipped.Lock.Nodes, shipped.Metrics.Listen = "", nil, ""
	shipped.Auth.Users = nil // users: {} in the file
	shipped.Auth.ACL = nil   // acl: [] in the file
	if !reflect.DeepEqual(*shipped, def) {
		t.Errorf("config.yaml states other values than the defaults:\n%+v\nwant\n%+v", *shipped, def)
	}
}

// TestPrintConfig: -print-config shows every key with secrets masked, and
// what it prints reads back as the same configuration.
func TestPrintConfig(t *testing.T) {
	certs := "/etc/lockproxy"
	path := writeConfig(t, fmt.Sprintf(`
backend: {addr: 127.0.0.1:6379, password: backend-secret, tls: {enabled: true, key_file: %s/backend.key}}
lock: {nodes: [127.0.0.1:7000], password: lock-secret, tls: {key_file: %[1]s/lock.key}}
auth: {requirepass: default-secret, users: {alice: alice-secret}, acl: ["user bob on >bob-secret ~app:* +@read"]}
tls: {cert_file: %[1]s/server.crt, key_file: %[1]s/server.key}
`, certs))
	var out bytes.Buffer
	err := run(context.Background(), process{
		args:   []string{"-config", path, "-print-config", "-set", "metrics.listen=127.0.0.1:9381"},
		env:    []string{"LOCKPROXY_LOCK_KEY_PREFIX=app:"},
		stdout: &out, stderr: testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	printed := out.String()
	for _, secret := range []string{"backend-secret", "lock-secret", "default-secret", "alice-secret", "bob-secret", ".key"} {
		if strings.Contains(printed, secret) {
			t.Errorf("-print-config shows %q:\n%s", secret, printed)
		}
	}
	for _, want := range []string{
		"listen: 127.0.0.1:9381", `key_prefix: 'app:'`, "node_timeout: 50ms", "max_ttl: 1h0m0s",
		"requirepass: '" + masked + "'", "alice: '" + masked + "'", "user bob on >" + masked + " ~app:* +@read", "cert_file: " + certs + "/server.crt",
	} {
		if !strings.Contains(printed, want) {
			t.Errorf("-print-config lacks %q:\n%s", want, printed)
		}
	}

	// Read back, it is the configuration it printed, secrets aside.
	back, err := loadConfig(writeConfig(t, printed), nil)
	if err != nil {
		t.Fatalf("the printed configuration does not load: %v\n%s", err, printed)
	}
	opts, _ := parseArgs([]string{"-config", path, "-set", "metrics.listen=127.0.0.1:9381"}, testWriter{t})
	want, err := configure(opts, []string{"LOCKPROXY_LOCK_KEY_PREFIX=app:"})
	if err != nil {
		t.Fatal(err)
	}
	mask(reflect.ValueOf(want).Elem())
	if !reflect.DeepEqual(back, want) {
		t.Errorf("read back:\n%+v\nwant\n%+v", back, want)
	}
}

// TestSecretsTagged: every key that can hold a secret is masked.
func TestSecretsTagged(t *testing.T) {
	var walk func(rt reflect.Type, prefix string)
	walk = func(rt reflect.Type, prefix string) {
		for i := range rt.NumField() {
			f := rt.Field(i)
			key := prefix + yamlName(f)
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, key+".")
				continue
			}
			looksSecret := strings.Contains(key, "pass") || strings.HasSuffix(key, "key_file") || key == "auth.users" || key == "auth.acl"
			if looksSecret != (f.Tag.Get("secret") == "true") {
				t.Errorf("%s: secret tag %q", key, f.Tag.Get("secret"))
			}
		}
	}
	walk(reflect.TypeFor[fileConfig](), "")
}

// TestTwoProxiesOneFile runs two proxies on one host from one config.yaml,
// which names a metrics address: the second gets its own from a flag, the
// first keeps the file's, and an environment variable sets a key for both.
func TestTwoProxiesOneFile(t *testing.T) {
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	metricsA, metricsB := free(), free()
	path := writeConfig(t, fmt.Sprintf("listen: 127.0.0.1:0\nmetrics: {listen: %q}\nbackend: {addr: embedded}\nlock: {nodes: [embedded]}\n", metricsA))
	// An embedded node runs in the test process, under -race: 250ms, not
	// the default 50ms, for a node call on a loaded machine.
	env := []string{"LOCKPROXY_LOG_LEVEL=warn", "LOCKPROXY_LOCK_MAX_TTL=5s", "LOCKPROXY_LOCK_NODE_TIMEOUT=250ms"}
	start := func(args ...string) string {
		ctx, cancel := context.WithCancel(context.Background())
		listening := make(chan net.Addr, 1)
		done := make(chan error, 1)
		go func() {
			pr := testProcess(t, append([]string{"-config", path}, args...), listening)
			pr.env = env
			done <- run(ctx, pr)
		}()
		select {
		case addr := <-listening:
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			})
			return addr.String()
		case err := <-done:
			cancel()
			t.Fatalf("run %q: %v", args, err)
		}
		return ""
	}
	a := start()
	b := start("-set", "metrics.listen="+metricsB)
	for _, m := range []string{metricsA, metricsB} {
		resp, err := http.Get("http://" + m + "/healthz")
		if err != nil {
			t.Fatalf("metrics on %s: %v", m, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("metrics on %s: %d", m, resp.StatusCode)
		}
	}
	ctx := context.Background()
	for _, addr := range []string{a, b} {
		c := newClient(t, addr, 2)
		if _, err := lock(ctx, c, "r", 1000); err != nil {
			t.Errorf("LOCK on %s: %v", addr, err)
		}
		// LOCKPROXY_LOCK_MAX_TTL reached both.
		if err := c.Do(ctx, "LOCK", "r2", 5001).Err(); err == nil || err.Error() != "ERR ttl-ms exceeds the maximum of 5000" {
			t.Errorf("LOCK above the max_ttl set in the environment on %s: %v", addr, err)
		}
	}
}

// TestSentinelConfig: backend.sentinel against backend.addr, each mistake
// with its message, and the mapping onto the proxy's Config.
func TestSentinelConfig(t *testing.T) {
	tests := []struct {
		name string
		give []string // -set flags over a file with lock nodes only
		want string   // a message the error contains; "" for none
	}{
		{name: "neither", give: nil, want: `backend.addr is empty (an address, or "embedded"), and no backend.sentinel is set`},
		{name: "both", give: []string{"backend.addr=127.0.0.1:6379", "backend.sentinel.master_name=m", "backend.sentinel.addrs=127.0.0.1:26379"},
			want: `backend.addr ("127.0.0.1:6379") and backend.sentinel are mutually exclusive`},
		{name: "no master name", give: []string{"backend.sentinel.addrs=127.0.0.1:26379"}, want: "backend.sentinel.master_name is empty"},
		{name: "no addrs", give: []string{"backend.sentinel.master_name=m"}, want: "backend.sentinel.addrs is empty"},
		{name: "bad addr", give: []string{"backend.sentinel.master_name=m", "backend.sentinel.addrs=127.0.0.1:26379,nohost"}, want: `backend.sentinel.addrs[1] "nohost": want host:port`},
		{name: "zero timeout", give: []string{"backend.sentinel.master_name=m", "backend.sentinel.addrs=a:1", "backend.sentinel.timeout=0s"}, want: "backend.sentinel.check_interval and timeout must be positive"},
		{name: "good", give: []string{"backend.sentinel.master_name=m", "backend.sentinel.addrs=a:1, b:2", "backend.sentinel.password=s"}},
		{name: "addr and cluster", give: []string{"backend.addr=127.0.0.1:6379", "backend.cluster=127.0.0.1:7001"},
			want: `backend.addr ("127.0.0.1:6379") and backend.cluster are mutually exclusive`},
		{name: "sentinel and cluster", give: []string{"backend.sentinel.master_name=m", "backend.sentinel.addrs=a:1", "backend.cluster=127.0.0.1:7001"},
			want: "backend.sentinel and backend.cluster are mutually exclusive"},
	}
	path := writeConfig(t, "lock: {nodes: [127.0.0.1:7000]}\n")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"-config", path}
			for _, g := range tt.give {
				args = append(args, "-set", g)
			}
			opts, err := parseArgs(args, testWriter{t})
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := configure(opts, nil)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("configure: %v", err)
				}
				s := cfg.proxyConfig().Backend.Sentinel
				if s.MasterName != "m" || strings.Join(s.Addrs, " ") != "a:1 b:2" || s.Password != "s" || s.CheckInterval != time.Second {
					t.Errorf("proxy sentinel config %+v", s)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("configure: %v, want %q", err, tt.want)
			}
		})
	}
}

// TestSharedConnections: auto is one shared connection per thread running
// Go code, a number is itself, and -print-config writes auto back.
func TestSharedConnections(t *testing.T) {
	threads := runtime.GOMAXPROCS(0)
	for _, tt := range []struct {
		file string
		want int
	}{
		{"", threads},
		{"backend: {shared_connections: auto}", threads},
		{"backend: {shared_connections: 1}", 1},
		{"backend: {shared_connections: 0}", 0},
		{"backend: {shared_connections: -1}", -1},
	} {
		cfg, err := loadConfig(writeConfig(t, tt.file+"\n"), nil)
		if err != nil {
			t.Fatalf("%q: %v", tt.file, err)
		}
		if got := cfg.proxyConfig().Backend.SharedConnections; got != tt.want {
			t.Errorf("%q: %d shared connections, want %d", tt.file, got, tt.want)
		}
	}
	var out bytes.Buffer
	if err := printConfig(&out, &fileConfig{Backend: backendConfig{SharedConnections: autoConns}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "shared_connections: auto\n") {
		t.Errorf("-print-config of auto:\n%s", out.String())
	}
}

// TestThreads: gomaxprocs 0 leaves one of Go's default CPUs to Redis
// unless GOMAXPROCS is set; a number of its own is kept.
func TestThreads(t *testing.T) {
	for _, tt := range []struct {
		gomaxprocs int
		env        []string
		goDefault  int
		want       int
	}{
		{0, nil, 1, 1},
		{0, nil, 2, 1},
		{0, nil, 8, 7},
		{0, []string{"HOME=/root", "GOMAXPROCS=2"}, 8, 0},
		{3, []string{"GOMAXPROCS=2"}, 8, 3},
		{4, nil, 2, 4},
	} {
		c := fileConfig{GOMAXPROCS: tt.gomaxprocs}
		if got := c.threads(tt.env, tt.goDefault); got != tt.want {
			t.Errorf("gomaxprocs %d, env %q, Go's default %d: %d threads, want %d", tt.gomaxprocs, tt.env, tt.goDefault, got, tt.want)
		}
	}
}
