package commands

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/quorum"
)

// testConfig has small maxima, so that the tests can cross them.
var testConfig = Config{MaxTTL: 10 * time.Second, MaxWait: 5 * time.Second}

func argv(args ...string) [][]byte {
	b := make([][]byte, len(args))
	for i, a := range args {
		b[i] = []byte(a)
	}
	return b
}

// mustNew is New for a Config that must be valid.
func mustNew(tb testing.TB, l *quorum.Locker, cfg Config, logger *zap.Logger) *Handler {
	tb.Helper()
	h, err := New(l, cfg, logger)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return h
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestParseLock(t *testing.T) {
	h := mustNew(t, nil, testConfig, nil)
	type want struct {
		resource  string
		ttl       time.Duration
		wait      time.Duration
		token     string
		keepalive bool
		err       string
	}
	tests := []struct {
		give []string
		want want
	}{
		{give: []string{"LOCK", "r", "1000"}, want: want{resource: "r", ttl: time.Second}},
		{give: []string{"lock", "", "1"}, want: want{resource: "", ttl: time.Millisecond}},
		{give: []string{"LOCK", "r", "10000"}, want: want{resource: "r", ttl: 10 * time.Second}},
		{
			give: []string{"LOCK", "r", "1000", "WAIT", "500", "TOKEN", "t1", "KEEPALIVE"},
			want: want{resource: "r", ttl: time.Second, wait: 500 * time.Millisecond, token: "t1", keepalive: true},
		},
		{
			give: []string{"LOCK", "r", "1000", "keepalive", "token", "t1", "wait", "0"},
			want: want{resource: "r", ttl: time.Second, token: "t1", keepalive: true},
		},
		{
			give: []string{"LOCK", "r", "1000", "KeepAlive", "Wait", "5000"},
			want: want{resource: "r", ttl: time.Second, wait: 5 * time.Second, keepalive: true},
		},
		{give: []string{"LOCK", "r", "1000", "TOKEN", "WAIT"}, want: want{resource: "r", ttl: time.Second, token: "WAIT"}},

		{give: []string{"LOCK"}, want: want{err: "ERR wrong number of arguments for 'lock' command"}},
		{give: []string{"LOCK", "r"}, want: want{err: "ERR wrong number of arguments for 'lock' command"}},
		{give: []string{"LOCK", "r", "abc"}, want: want{err: "ERR value is not an integer or out of range"}},
		{give: []string{"LOCK", "r", "1.5"}, want: want{err: "ERR value is not an integer or out of range"}},
		{give: []string{"LOCK", "r", ""}, want: want{err: "ERR value is not an integer or out of range"}},
		{give: []string{"LOCK", "r", "+5"}, want: want{err: "ERR value is not an integer or out of range"}},
		{give: []string{"LOCK", "r", "99999999999999999999"}, want: want{err: "ERR value is not an integer or out of range"}},
		{give: []string{"LOCK", "r", "0"}, want: want{err: "ERR invalid expire time in 'lock' command"}},
		{give: []string{"LOCK", "r", "-5"}, want: want{err: "ERR invalid expire time in 'lock' command"}},
		{give: []string{"LOCK", "r", "10001"}, want: want{err: "ERR ttl-ms exceeds the maximum of 10000"}},
		{give: []string{"LOCK", "r", "1000", "WAIT"}, want: want{err: "ERR syntax error"}},
		{give: []string{"LOCK", "r", "1000", "WAIT", "x"}, want: want{err: "ERR value is not an integer or out of range"}},
		{give: []string{"LOCK", "r", "1000", "WAIT", "-1"}, want: want{err: "ERR WAIT timeout-ms is negative"}},
		{give: []string{"LOCK", "r", "1000", "WAIT", "5001"}, want: want{err: "ERR WAIT timeout-ms exceeds the maximum of 5000"}},
		{give: []string{"LOCK", "r", "1000", "WAIT", "1", "WAIT", "1"}, want: want{err: "ERR syntax error"}},
		{give: []string{"LOCK", "r", "1000", "TOKEN"}, want: want{err: "ERR syntax error"}},
		{give: []string{"LOCK", "r", "1000", "TOKEN", ""}, want: want{err: "ERR token must not be empty"}},
		{give: []string{"LOCK", "r", "1000", "TOKEN", "a", "token", "b"}, want: want{err: "ERR syntax error"}},
		{give: []string{"LOCK", "r", "1000", "KEEPALIVE", "KEEPALIVE"}, want: want{err: "ERR syntax error"}},
		{give: []string{"LOCK", "r", "1000", "NX"}, want: want{err: "ERR syntax error"}},
		{give: []string{"LOCK", "r", "1000", "KEEPALIVEX"}, want: want{err: "ERR syntax error"}},
		{give: []string{"LOCK", "r", "1000", "500"}, want: want{err: "ERR syntax error"}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.give), func(t *testing.T) {
			a, err := h.parseLock(argv(tt.give...))
			got := want{err: errText(err)}
			if err == nil {
				got = want{
					resource:  string(a.resource),
					ttl:       a.ttl,
					wait:      a.wait,
					token:     string(a.token),
					keepalive: a.keepalive,
				}
			}
			if got != tt.want {
				t.Errorf("parseLock(%q) = %+v, want %+v", tt.give, got, tt.want)
			}
		})
	}
}

func TestParseLockNoToken(t *testing.T) {
	// A LOCK without TOKEN must leave the token nil, so that quorum
	// generates one, whereas an UNLOCK or EXTEND without token must leave it
	// nil, so that the recorded one is used.
	h := mustNew(t, nil, testConfig, nil)
	if a, err := h.parseLock(argv("LOCK", "r", "100", "KEEPALIVE")); err != nil || a.token != nil {
		t.Errorf("parseLock without TOKEN: token %q, err %v; want nil, nil", a.token, err)
	}
	if a, err := parseUnlock(argv("UNLOCK", "r")); err != nil || a.token != nil {
		t.Errorf("parseUnlock without token: token %q, err %v; want nil, nil", a.token, err)
	}
	if a, err := h.parseExtend(argv("EXTEND", "r", "100")); err != nil || a.token != nil {
		t.Errorf("parseExtend without token: token %q, err %v; want nil, nil", a.token, err)
	}
}

func TestParseUnlock(t *testing.T) {
	type want struct {
		resource string
		token    string
		err      string
	}
	tests := []struct {
		give []string
		want want
	}{
		{give: []string{"UNLOCK", "r"}, want: want{resource: "r"}},
		{give: []string{"unlock", "r", "tok"}, want: want{resource: "r", token: "tok"}},
		{give: []string{"UNLOCK"}, want: want{err: "ERR wrong number of arguments for 'unlock' command"}},
		{give: []string{"UNLOCK", "r", "tok", "x"}, want: want{err: "ERR wrong number of arguments for 'unlock' command"}},
		{give: []string{"UNLOCK", "r", ""}, want: want{err: "ERR token must not be empty"}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.give), func(t *testing.T) {
			a, err := parseUnlock(argv(tt.give...))
			got := want{err: errText(err)}
			if err == nil {
				got = want{resource: string(a.resource), token: string(a.token)}
			}
			if got != tt.want {
				t.Errorf("parseUnlock(%q) = %+v, want %+v", tt.give, got, tt.want)
			}
		})
	}
}

func TestParseExtend(t *testing.T) {
	h := mustNew(t, nil, testConfig, nil)
	type want struct {
		resource string
		ttl      time.Duration
		token    string
		err      string
	}
	tests := []struct {
		give []string
		want want
	}{
		{give: []string{"EXTEND", "r", "2000"}, want: want{resource: "r", ttl: 2 * time.Second}},
		{give: []string{"Extend", "r", "2000", "tok"}, want: want{resource: "r", ttl: 2 * time.Second, token: "tok"}},
		{give: []string{"EXTEND"}, want: want{err: "ERR wrong number of arguments for 'extend' command"}},
		{give: []string{"EXTEND", "r"}, want: want{err: "ERR wrong number of arguments for 'extend' command"}},
		{give: []string{"EXTEND", "r", "1", "tok", "x"}, want: want{err: "ERR wrong number of arguments for 'extend' command"}},
		{give: []string{"EXTEND", "r", "x"}, want: want{err: "ERR value is not an integer or out of range"}},
		{give: []string{"EXTEND", "r", "0"}, want: want{err: "ERR invalid expire time in 'extend' command"}},
		{give: []string{"EXTEND", "r", "-1", "tok"}, want: want{err: "ERR invalid expire time in 'extend' command"}},
		{give: []string{"EXTEND", "r", "10001"}, want: want{err: "ERR ttl-ms exceeds the maximum of 10000"}},
		{give: []string{"EXTEND", "r", "100", ""}, want: want{err: "ERR token must not be empty"}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.give), func(t *testing.T) {
			a, err := h.parseExtend(argv(tt.give...))
			got := want{err: errText(err)}
			if err == nil {
				got = want{resource: string(a.resource), ttl: a.ttl, token: string(a.token)}
			}
			if got != tt.want {
				t.Errorf("parseExtend(%q) = %+v, want %+v", tt.give, got, tt.want)
			}
		})
	}
}

func TestParseInt(t *testing.T) {
	type want struct {
		n  int64
		ok bool
	}
	tests := []struct {
		give string
		want want
	}{
		{give: "0", want: want{0, true}},
		{give: "7", want: want{7, true}},
		{give: "-7", want: want{-7, true}},
		{give: "1234567890", want: want{1234567890, true}},
		{give: strconv.FormatInt(math.MaxInt64, 10), want: want{math.MaxInt64, true}},
		{give: strconv.FormatInt(math.MinInt64, 10), want: want{math.MinInt64, true}},
		{give: "9223372036854775808", want: want{0, false}},
		{give: "-9223372036854775809", want: want{0, false}},
		{give: "18446744073709551615", want: want{0, false}},
		{give: "184467440737095516150", want: want{0, false}},
		{give: "", want: want{0, false}},
		{give: "-", want: want{0, false}},
		{give: "-0", want: want{0, false}},
		{give: "00", want: want{0, false}},
		{give: "01", want: want{0, false}},
		{give: "+1", want: want{0, false}},
		{give: " 1", want: want{0, false}},
		{give: "1 ", want: want{0, false}},
		{give: "1e3", want: want{0, false}},
		{give: "0x10", want: want{0, false}},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			n, ok := parseInt([]byte(tt.give))
			if got := (want{n, ok}); got != tt.want {
				t.Errorf("parseInt(%q) = %v, want %v", tt.give, got, tt.want)
			}
		})
	}
}

func TestIs(t *testing.T) {
	h := mustNew(t, nil, DefaultConfig(), nil)
	tests := []struct {
		give string
		want bool
	}{
		{give: "lock", want: true},
		{give: "LOCK", want: true},
		{give: "Lock", want: true},
		{give: "unlock", want: true},
		{give: "UNLOCK", want: true},
		{give: "extend", want: true},
		{give: "eXtEnD", want: true},
		{give: "", want: false},
		{give: "loc", want: false},
		{give: "locks", want: true},
		{give: "lockss", want: false},
		{give: "get", want: false},
		{give: "l0ck", want: false},
		{give: "lock\x00", want: false},
		{give: "LOCK ", want: false},
		{give: "unlocked", want: false},
		{give: "\x0cOCK", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			if got := h.Is([]byte(tt.give)); got != tt.want {
				t.Errorf("Is(%q) = %v, want %v", tt.give, got, tt.want)
			}
		})
	}
	name := []byte("UNLOCK")
	if n := testing.AllocsPerRun(100, func() { h.Is(name) }); n != 0 {
		t.Errorf("Is allocates %v times, want 0", n)
	}
}

func TestParseDoesNotAllocate(t *testing.T) {
	h := mustNew(t, nil, testConfig, nil)
	lock := argv("LOCK", "orders:42", "30000", "WAIT", "1000", "TOKEN", "0f6e8a3c", "KEEPALIVE")
	bad := argv("LOCK", "orders:42", "30000", "WAIT", "999999")
	extend := argv("EXTEND", "orders:42", "30000", "0f6e8a3c")
	if n := testing.AllocsPerRun(100, func() { h.parseLock(lock) }); n != 0 {
		t.Errorf("parseLock allocates %v times, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { h.parseLock(bad) }); n != 0 {
		t.Errorf("parseLock of a bad command allocates %v times, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { h.parseExtend(extend) }); n != 0 {
		t.Errorf("parseExtend allocates %v times, want 0", n)
	}
}

func TestConfig(t *testing.T) {
	tests := []struct {
		give    Config
		wantErr bool
	}{
		{give: DefaultConfig(), wantErr: false},
		{give: Config{MaxTTL: time.Millisecond}, wantErr: false},
		{give: Config{MaxTTL: time.Microsecond, MaxWait: time.Second}, wantErr: true},
		{give: Config{MaxTTL: 0, MaxWait: time.Second}, wantErr: true},
		{give: Config{MaxTTL: time.Second, MaxWait: -time.Second}, wantErr: true},
		{give: Config{MaxTTL: time.Second, MaxResources: -1}, wantErr: true},
		{give: Config{MaxTTL: time.Second, MaxResources: 129}, wantErr: true},
		{give: Config{MaxTTL: time.Second, MaxResources: 128}, wantErr: false},
		{give: Config{MaxTTL: time.Second, MaxPermits: -1}, wantErr: true},
		{give: Config{MaxTTL: time.Second, MaxPermits: 1 << 21}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%+v", tt.give), func(t *testing.T) {
			if err := tt.give.Validate(); (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v, want error: %v", err, tt.wantErr)
			}
		})
	}
	if got, want := DefaultConfig(), (Config{MaxTTL: time.Hour, MaxWait: time.Minute, MaxResources: 64, MaxPermits: 1024}); got != want {
		t.Errorf("DefaultConfig() = %+v, want %+v", got, want)
	}
}

// TestNewRejectsInvalidConfig: New uses no Config that fails Validate; it
// does not replace bad values with defaults.
func TestNewRejectsInvalidConfig(t *testing.T) {
	tests := []struct {
		give Config
		want string
	}{
		{give: Config{}, want: "commands: MaxTTL 0s is below 1ms"},
		{give: Config{MaxTTL: time.Second, MaxWait: -time.Second}, want: "commands: MaxWait -1s is negative"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%+v", tt.give), func(t *testing.T) {
			h, err := New(nil, tt.give, nil)
			if h != nil || errText(err) != tt.want {
				t.Errorf("New(%+v) = %v, %q, want nil, %q", tt.give, h, errText(err), tt.want)
			}
		})
	}
}

// TestZeroMaxWait: MaxWait 0 allows only WAIT 0.
func TestZeroMaxWait(t *testing.T) {
	h := mustNew(t, nil, Config{MaxTTL: time.Hour}, nil)
	tests := []struct {
		give []string
		want string
	}{
		{give: []string{"LOCK", "r", "3600000"}, want: ""},
		{give: []string{"LOCK", "r", "3600001"}, want: "ERR ttl-ms exceeds the maximum of 3600000"},
		{give: []string{"LOCK", "r", "1", "WAIT", "0"}, want: ""},
		{give: []string{"LOCK", "r", "1", "WAIT", "1"}, want: "ERR WAIT timeout-ms exceeds the maximum of 0"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.give), func(t *testing.T) {
			if _, err := h.parseLock(argv(tt.give...)); errText(err) != tt.want {
				t.Errorf("parseLock(%q) error = %q, want %q", tt.give, errText(err), tt.want)
			}
		})
	}
}

func TestEngineErrorReplies(t *testing.T) {
	tests := []struct {
		give error
		want string
	}{
		{give: &quorum.NoQuorumError{Answered: 1, Total: 3}, want: "-NOQUORUM 1 of 3 lock nodes answered\r\n"},
		{give: fmt.Errorf("lock %q: %w", "r", &quorum.NoQuorumError{Answered: 2, Total: 5}), want: "-NOQUORUM 2 of 5 lock nodes answered\r\n"},
		{give: fmt.Errorf("lock %q: %w", "r", context.DeadlineExceeded), want: "-ERR command timed out\r\n"},
		{give: fmt.Errorf("lock %q: %w", "r", context.Canceled), want: "-ERR command cancelled\r\n"},
		{give: errors.New("something\r\nodd"), want: "-ERR unexpected error from the lock engine\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.give.Error(), func(t *testing.T) {
			if got := string(appendEngineErr([]byte("+prev\r\n"), tt.give)); got != "+prev\r\n"+tt.want {
				t.Errorf("appendEngineErr(%v) = %q, want %q", tt.give, got, "+prev\r\n"+tt.want)
			}
		})
	}
}

func TestNullReply(t *testing.T) {
	tests := []struct {
		give bool
		want string
	}{
		{give: false, want: "*-1\r\n"},
		{give: true, want: "_\r\n"},
	}
	for _, tt := range tests {
		t.Run(strconv.FormatBool(tt.give), func(t *testing.T) {
			if got := string(appendNull(nil, tt.give)); got != tt.want {
				t.Errorf("appendNull(resp3=%v) = %q, want %q", tt.give, got, tt.want)
			}
		})
	}
}

func TestRetryDelay(t *testing.T) {
	tests := []struct {
		ttl, left time.Duration
		want      time.Duration
	}{
		{ttl: 300 * time.Millisecond, left: 200 * time.Millisecond, want: 30 * time.Millisecond},
		{ttl: 300 * time.Millisecond, left: 20 * time.Millisecond, want: 10 * time.Millisecond},
		{ttl: 300 * time.Millisecond, left: time.Microsecond, want: time.Millisecond},
		{ttl: 5 * time.Millisecond, left: time.Second, want: time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.ttl, tt.left), func(t *testing.T) {
			if got := retryDelay(tt.ttl, tt.left); got != tt.want {
				t.Errorf("retryDelay(%v, %v) = %v, want %v", tt.ttl, tt.left, got, tt.want)
			}
		})
	}
}

func BenchmarkParseLock(b *testing.B) {
	h := mustNew(b, nil, DefaultConfig(), nil)
	for _, bm := range []struct {
		name string
		args [][]byte
	}{
		{name: "plain", args: argv("LOCK", "orders:42", "30000")},
		{name: "options", args: argv("lock", "orders:42", "30000", "wait", "1000", "token", "0f6e8a3c-5b1e-4c6e-9b43-0d1f1e0b8a55", "keepalive")},
		{name: "bad", args: argv("LOCK", "orders:42", "30000", "NX")},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				h.parseLock(bm.args)
			}
		})
	}
}

func BenchmarkParseExtend(b *testing.B) {
	h := mustNew(b, nil, DefaultConfig(), nil)
	args := argv("EXTEND", "orders:42", "30000", "0f6e8a3c-5b1e-4c6e-9b43-0d1f1e0b8a55")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.parseExtend(args); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkIs(b *testing.B) {
	h := mustNew(b, nil, DefaultConfig(), nil)
	names := argv("GET", "lock", "UNLOCK", "Extend", "HGETALL")
	b.ReportAllocs()
	for b.Loop() {
		for _, n := range names {
			h.Is(n)
		}
	}
}
