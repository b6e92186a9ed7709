package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestExamples runs every program under examples/ as a subprocess against
// the whole proxy (real redis-server backend and three lock nodes), with
// LOCKPROXY_ADDR set. Each example checks its own replies and exits
// non-zero on a mismatch. What an example needs (Debian's python3-redis,
// Node.js and npm, redis-cli, the npm packages) is installed when missing;
// when that is impossible the test fails and says why: it never skips.
func TestExamples(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	addr := startApp(t, "lock: {node_timeout: 250ms}\n", "-backend", backend.Addr, "-lock-nodes", nodes)

	goBin := filepath.Join(t.TempDir(), "example-go")
	var npmOnce sync.Once
	var npmErr error
	nodeSetup := func(t *testing.T) {
		exNeed(t, []string{"nodejs"}, "node", "--version")
		exNeed(t, []string{"npm"}, "npm", "--version")
		npmOnce.Do(func() { npmErr = exNpmCI("examples/node") })
		if npmErr != nil {
			t.Fatal(npmErr)
		}
	}
	tests := []struct {
		name  string
		setup func(t *testing.T)
		cmd   []string
		want  []string // lines the example prints when every check passed
	}{
		{"go-redis", func(t *testing.T) {
			if out, err := exRun(3*time.Minute, "", nil, "go", "build", "-o", goBin, "./examples/go"); err != nil {
				t.Fatalf("go build ./examples/go: %v\n%s", err, out)
			}
		}, []string{goBin}, []string{"go-redis RESP2: ok", "go-redis RESP3: ok"}},
		// Debian's redis-py is for Debian's python3, not one on PATH (pyenv).
		{"redis-py", func(t *testing.T) {
			exNeed(t, []string{"python3-redis"}, "/usr/bin/python3", "-c", "import redis")
		}, []string{"/usr/bin/python3", "examples/python/lock.py"}, []string{"RESP2: ok", "RESP3: "}},
		{"ioredis", nodeSetup, []string{"node", "examples/node/ioredis.js"},
			[]string{"ioredis RESP2: ok", "ioredis RESP3: ok"}},
		{"node-redis", nodeSetup, []string{"node", "examples/node/node-redis.js"},
			[]string{"node-redis RESP2: ok", "node-redis RESP3: ok"}},
		{"go-redis MLOCK", func(t *testing.T) {
			if out, err := exRun(3*time.Minute, "", nil, "go", "build", "-o", goBin+"-mlock", "./examples/mlock/go"); err != nil {
				t.Fatalf("go build ./examples/mlock/go: %v\n%s", err, out)
			}
		}, []string{goBin + "-mlock"}, []string{"go-redis MLOCK RESP2: ok", "go-redis MLOCK RESP3: ok"}},
		{"redis-py MLOCK", func(t *testing.T) {
			exNeed(t, []string{"python3-redis"}, "/usr/bin/python3", "-c", "import redis")
		}, []string{"/usr/bin/python3", "examples/mlock/python/mlock.py"}, []string{"MLOCK RESP2: ok", "MLOCK RESP3: "}},
		{"go-redis read-write and semaphore", func(t *testing.T) {
			if out, err := exRun(3*time.Minute, "", nil, "go", "build", "-o", goBin+"-rwsem", "./examples/gorwsem"); err != nil {
				t.Fatalf("go build ./examples/gorwsem: %v\n%s", err, out)
			}
		}, []string{goBin + "-rwsem"}, []string{"go-redis rwsem RESP2: ok", "go-redis rwsem RESP3: ok"}},
		{"redis-py read-write and semaphore", func(t *testing.T) {
			exNeed(t, []string{"python3-redis"}, "/usr/bin/python3", "-c", "import redis")
		}, []string{"/usr/bin/python3", "examples/python/rwsem.py"}, []string{"rwsem RESP2: ok", "rwsem RESP3: "}},
		{"redis-cli", func(t *testing.T) {
			exNeed(t, []string{"redis-tools"}, "redis-cli", "--version")
		}, []string{"bash", "examples/cli/lock.sh"}, []string{"redis-cli RESP2: ok", "redis-cli RESP3: ok"}},
		{"go-redis reentrant", func(t *testing.T) {
			if out, err := exRun(3*time.Minute, "", nil, "go", "build", "-o", goBin+"-reentrant", "./examples/reentrant/go"); err != nil {
				t.Fatalf("go build ./examples/reentrant/go: %v\n%s", err, out)
			}
		}, []string{goBin + "-reentrant"}, []string{"go-redis reentrant RESP2: ok", "go-redis reentrant RESP3: ok"}},
		{"redis-py reentrant", func(t *testing.T) {
			exNeed(t, []string{"python3-redis"}, "/usr/bin/python3", "-c", "import redis")
		}, []string{"/usr/bin/python3", "examples/reentrant/python/reentrant.py"}, []string{"redis-py reentrant RESP2: ok", "redis-py reentrant RESP3: "}},
		{"go-redis FENCED", func(t *testing.T) {
			if out, err := exRun(3*time.Minute, "", nil, "go", "build", "-o", goBin+"-fenced", "./examples/fenced/go"); err != nil {
				t.Fatalf("go build ./examples/fenced/go: %v\n%s", err, out)
			}
		}, []string{goBin + "-fenced"}, []string{"go-redis FENCED RESP2: ok", "go-redis FENCED RESP3: ok"}},
		{"redis-py FENCED", func(t *testing.T) {
			exNeed(t, []string{"python3-redis"}, "/usr/bin/python3", "-c", "import redis")
		}, []string{"/usr/bin/python3", "examples/fenced/python/fenced.py"}, []string{"redis-py FENCED RESP2: ok", "redis-py FENCED RESP3: "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each example locks its own resources
			tt.setup(t)
			start := time.Now()
			out, err := exRun(time.Minute, "", []string{"LOCKPROXY_ADDR=" + addr}, tt.cmd[0], tt.cmd[1:]...)
			if err != nil {
				t.Fatalf("%s: %v after %v\n%s", strings.Join(tt.cmd, " "), err, time.Since(start).Round(time.Millisecond), out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Fatalf("%s exited 0 without printing %q:\n%s", strings.Join(tt.cmd, " "), w, out)
				}
			}
			t.Logf("%s", strings.TrimSpace(string(out)))
		})
	}
}

// exRun runs a command in dir (the package directory when empty) with env
// added to the test's environment, and returns its combined output. The
// command runs in its own process group, killed whole when timeout passes
// or the test binary dies.
func exRun(timeout time.Duration, dir string, env []string, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v (%v)", timeout, err)
	}
	return out, err
}

// exNeed makes sure the probe command succeeds, installing Debian's packages
// pkgs when it does not.
func exNeed(t *testing.T, pkgs []string, probe ...string) {
	t.Helper()
	if exec.Command(probe[0], probe[1:]...).Run() == nil {
		return
	}
	if err := exAptInstall(probe, pkgs); err != nil {
		t.Fatalf("%s fails and %s could not be installed: %v", strings.Join(probe, " "), strings.Join(pkgs, " "), err)
	}
	if out, err := exec.Command(probe[0], probe[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s still fails after installing %s: %v\n%s", strings.Join(probe, " "), strings.Join(pkgs, " "), err, out)
	}
}

// exAptInstall installs Debian packages as root, serialised with the file
// lock internal/redistest uses, since test binaries may run at once.
func exAptInstall(probe, pkgs []string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("not root: run apt-get install -y %s", strings.Join(pkgs, " "))
	}
	return exInstallLock(func() error {
		if exec.Command(probe[0], probe[1:]...).Run() == nil {
			return nil // installed by another test meanwhile
		}
		for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq"}, pkgs...)} {
			out, err := exRun(5*time.Minute, "", []string{"DEBIAN_FRONTEND=noninteractive"}, "apt-get", args...)
			if err != nil {
				return fmt.Errorf("apt-get %s: %v: %s", strings.Join(args, " "), err, exLastLines(string(out), 5))
			}
		}
		return nil
	})
}

// exNpmCI installs the packages of dir's package-lock.json with npm ci,
// unless node_modules already holds exactly those versions.
func exNpmCI(dir string) error {
	if exNodeModulesCurrent(dir) {
		return nil
	}
	return exInstallLock(func() error {
		if exNodeModulesCurrent(dir) {
			return nil
		}
		out, err := exRun(3*time.Minute, dir, nil, "npm", "ci", "--no-audit", "--no-fund")
		if err != nil {
			return fmt.Errorf("npm ci in %s: %v: %s", dir, err, exLastLines(string(out), 10))
		}
		if !exNodeModulesCurrent(dir) {
			return fmt.Errorf("npm ci in %s did not install package-lock.json's versions", dir)
		}
		return nil
	})
}

// exNodeModulesCurrent tells whether dir/node_modules holds the versions that
// dir/package-lock.json names (npm records what it installed in
// node_modules/.package-lock.json).
func exNodeModulesCurrent(dir string) bool {
	versions := func(path string) (map[string]string, error) {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var lock struct {
			Packages map[string]struct{ Version string } `json:"packages"`
		}
		if err := json.Unmarshal(raw, &lock); err != nil {
			return nil, err
		}
		v := map[string]string{}
		for name, p := range lock.Packages {
			if name != "" { // the project itself
				v[name] = p.Version
			}
		}
		return v, nil
	}
	want, err1 := versions(filepath.Join(dir, "package-lock.json"))
	have, err2 := versions(filepath.Join(dir, "node_modules", ".package-lock.json"))
	return err1 == nil && err2 == nil && len(want) > 0 && maps.Equal(want, have)
}

func exInstallLock(fn func() error) error {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "lockproxy-apt.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return fn()
}

func exLastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
