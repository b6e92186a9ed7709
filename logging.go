package main

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger builds the logger of log.format (json, or else console) at
// log.level; validate has checked both. The level is atomic so that SIGHUP
// can change it.
func newLogger(c logConfig) (*zap.Logger, zap.AtomicLevel, error) {
	atomic := zap.NewAtomicLevel()
	lvl, err := parseLevel(c.Level)
	if err != nil {
		return nil, atomic, err
	}
	atomic.SetLevel(lvl)
	zc := zap.NewDevelopmentConfig()
	zc.Development = false
	if c.Format == "json" {
		zc = zap.NewProductionConfig()
	}
	zc.Level = atomic
	zc.DisableStacktrace = true
	logger, err := zc.Build()
	return logger, atomic, err
}

// parseLevel parses log.level.
func parseLevel(s string) (zapcore.Level, error) {
	lvl, err := zapcore.ParseLevel(s)
	if err != nil {
		return lvl, fmt.Errorf("log.level: %w", err)
	}
	return lvl, nil
}

// redisLogger hands go-redis's log lines to zap, so that they come out in
// log.format like every other line: go-redis logs through one
// package-level logger (redis.SetLogger), by default as plain text on
// stderr. Its lines carry no level. They are logged at Debug: most are
// failed dials to a lock node that is down, one per call, while quorum
// already warns once when a node goes down and once when it comes back. A
// line about a panic is an Error.
type redisLogger struct{ log *zap.Logger }

// Printf is go-redis's logging interface.
func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	level := zapcore.DebugLevel
	if strings.Contains(format, "panic") {
		level = zapcore.ErrorLevel
	}
	if ce := l.log.Check(level, "go-redis"); ce != nil {
		ce.Write(zap.String("detail", strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")))
	}
}
