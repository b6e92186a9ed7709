package quorum

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		give    func(*Config)
		wantErr bool
	}{
		{"default", func(*Config) {}, false},
		{"zero drift", func(c *Config) { c.DriftFactor = 0 }, false},
		{"equal retry bounds", func(c *Config) { c.RetryMax = c.RetryMin }, false},
		{"zero node timeout", func(c *Config) { c.NodeTimeout = 0 }, true},
		{"negative node timeout", func(c *Config) { c.NodeTimeout = -time.Second }, true},
		{"negative drift", func(c *Config) { c.DriftFactor = -0.1 }, true},
		{"drift one", func(c *Config) { c.DriftFactor = 1 }, true},
		{"drift NaN", func(c *Config) { c.DriftFactor = math.NaN() }, true},
		{"empty prefix", func(c *Config) { c.KeyPrefix = "" }, true},
		{"zero retry min", func(c *Config) { c.RetryMin = 0 }, true},
		{"max ttl below 1ms", func(c *Config) { c.MaxTTL = time.Millisecond - 1 }, true},
		{"zero probe interval", func(c *Config) { c.ProbeInterval = 0 }, true},
		{"retry max below min", func(c *Config) { c.RetryMax = c.RetryMin - 1 }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.give(&cfg)
			err := cfg.Validate()
			if (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v, want error: %v", err, tt.wantErr)
			}
		})
	}
}

func TestDefaultConfig(t *testing.T) {
	want := Config{
		NodeTimeout:   50 * time.Millisecond,
		DriftFactor:   0.01,
		KeyPrefix:     "lockproxy:",
		MaxTTL:        time.Hour,
		ProbeInterval: 100 * time.Millisecond,
		RetryMin:      5 * time.Millisecond,
		RetryMax:      50 * time.Millisecond,
	}
	if got := DefaultConfig(); got != want {
		t.Errorf("DefaultConfig() = %+v, want %+v", got, want)
	}
}

func TestValidity(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name    string
		ttl     time.Duration
		elapsed time.Duration
		drift   float64
		want    time.Duration
	}{
		{"instant", 10 * time.Second, 0, 0.01, 10*time.Second - 100*ms - 2*ms},
		{"some elapsed", 10 * time.Second, 5 * ms, 0.01, 10*time.Second - 5*ms - 100*ms - 2*ms},
		{"no drift factor", time.Second, 10 * ms, 0, time.Second - 10*ms - 2*ms},
		{"large drift", time.Second, 0, 0.5, 500*ms - 2*ms},
		{"exactly used up", 100 * ms, 97 * ms, 0.01, 0},
		{"overrun", 100 * ms, 200 * ms, 0.01, -103 * ms},
		{"tiny ttl", ms, 0, 0.01, ms - 10*time.Microsecond - 2*ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := validity(tt.ttl, tt.elapsed, tt.drift); got != tt.want {
				t.Errorf("validity(%v, %v, %v) = %v, want %v", tt.ttl, tt.elapsed, tt.drift, got, tt.want)
			}
		})
	}
}

func TestCheckTTL(t *testing.T) {
	tests := []struct {
		give    time.Duration
		want    time.Duration
		wantErr bool
	}{
		{time.Second, time.Second, false},
		{time.Millisecond, time.Millisecond, false},
		{1500 * time.Microsecond, time.Millisecond, false},
		{999 * time.Microsecond, 0, true},
		{0, 0, true},
		{-time.Second, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.give.String(), func(t *testing.T) {
			got, err := checkTTL(tt.give)
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("checkTTL(%v) = %v, %v; want %v, error %v", tt.give, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestQuorumSize(t *testing.T) {
	tests := []struct {
		nodes int
		want  int
	}{
		{1, 1}, {2, 2}, {3, 2}, {4, 3}, {5, 3}, {6, 4}, {7, 4},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.nodes), func(t *testing.T) {
			opts := make([]*redis.Options, tt.nodes)
			for i := range opts {
				opts[i] = &redis.Options{Addr: "127.0.0.1:1"} // never contacted
			}
			l, err := New(opts, DefaultConfig(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if l.quorum != tt.want || l.Nodes() != tt.nodes {
				t.Errorf("quorum = %d, Nodes() = %d; want %d, %d", l.quorum, l.Nodes(), tt.want, tt.nodes)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	bad := DefaultConfig()
	bad.NodeTimeout = 0
	node := &redis.Options{Addr: "127.0.0.1:1"}
	tests := []struct {
		name  string
		nodes []*redis.Options
		cfg   Config
	}{
		{"no nodes", nil, DefaultConfig()},
		{"nil node", []*redis.Options{node, nil}, DefaultConfig()},
		{"bad config", []*redis.Options{node}, bad},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := New(tt.nodes, tt.cfg, nil)
			if err == nil {
				l.Close()
				t.Fatal("New succeeded")
			}
		})
	}
}

func TestNewOverridesClientOptions(t *testing.T) {
	cfg := DefaultConfig()
	give := &redis.Options{Addr: "127.0.0.1:1", MaxRetries: 5, ReadTimeout: time.Minute, WriteTimeout: -1, DialTimeout: 10 * time.Millisecond}
	l, err := New([]*redis.Options{give}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := l.nodes[0].client.Options()
	// Reads and writes get the keeper's bound; every call has its context's.
	if got.MaxRetries != 0 || !got.ContextTimeoutEnabled || got.ReadTimeout != 3*cfg.NodeTimeout ||
		got.WriteTimeout != 3*cfg.NodeTimeout || got.DialTimeout != 10*time.Millisecond || got.PoolTimeout != cfg.NodeTimeout ||
		got.PipelinePoolSize != -1 {
		t.Errorf("client options: MaxRetries %d, ContextTimeoutEnabled %v, Read %v, Write %v, Dial %v, Pool %v",
			got.MaxRetries, got.ContextTimeoutEnabled, got.ReadTimeout, got.WriteTimeout, got.DialTimeout, got.PoolTimeout)
	}
	if give.MaxRetries != 5 || give.ContextTimeoutEnabled {
		t.Errorf("caller's options were modified: %+v", give)
	}
}

func TestNoQuorumError(t *testing.T) {
	var err error = &NoQuorumError{Answered: 1, Total: 3}
	if got, want := err.Error(), "quorum: 1 of 3 lock nodes answered"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	wrapped := fmt.Errorf("lock %q: %w", "orders", err)
	var nq *NoQuorumError
	if !errors.As(wrapped, &nq) || nq.Answered != 1 || nq.Total != 3 {
		t.Errorf("errors.As through wrapping = %v, %+v", errors.As(wrapped, &nq), nq)
	}
	if errors.Is(wrapped, ErrNotAcquired) || errors.Is(wrapped, ErrNotHeld) {
		t.Error("NoQuorumError matches a sentinel")
	}
	if !retryable(wrapped) || !retryable(ErrNotAcquired) || retryable(ErrNotHeld) || retryable(errClosed) {
		t.Error("retryable classifies wrongly")
	}
}
