package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// lockedBuffer is a bytes.Buffer for a logger that go-redis's goroutines
// may write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRedisLogsThroughZap: a line go-redis logs (here a failed dial) reaches
// the zap logger installed as run installs it, and comes out as JSON with
// log.format json; nothing of it goes to go-redis's own stderr logger.
func TestRedisLogsThroughZap(t *testing.T) {
	var out lockedBuffer
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&out), zapcore.DebugLevel)
	redis.SetLogger(redisLogger{zap.New(core).Named("go-redis")})
	t.Cleanup(func() { redis.SetLogger(redisLogger{zap.NewNop()}) })

	addr := unusedAddr(t) // nobody listens there
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("PING to a closed port succeeded")
	}

	var found bool
	for line := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("not a JSON line: %q: %v", line, err)
		}
		detail, _ := entry["detail"].(string)
		if entry["logger"] == "go-redis" && entry["msg"] == "go-redis" && entry["level"] == "debug" &&
			strings.Contains(detail, "failed to dial") && strings.Contains(detail, addr) && !strings.HasPrefix(detail, "redis: ") {
			found = true
		}
	}
	if !found {
		t.Errorf("go-redis's failed dial did not reach the zap logger; it logged:\n%s", out.String())
	}
}

func TestRedisLoggerLevels(t *testing.T) {
	var out lockedBuffer
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&out), zapcore.InfoLevel)
	l := redisLogger{zap.New(core)}
	l.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v", 1, "refused")
	if out.String() != "" {
		t.Errorf("a failed dial was logged above Debug: %s", out.String())
	}
	l.Printf(context.Background(), "addIdleConn panic: %+v", "boom")
	if s := out.String(); !strings.Contains(s, `"level":"error"`) || !strings.Contains(s, `"detail":"addIdleConn panic: boom"`) {
		t.Errorf("a panic in go-redis: %s, want an error entry", s)
	}
}
