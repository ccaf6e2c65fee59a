package devstack

import (
	"context"
	"log/slog"
	"sort"
	"sync/atomic"

	"go.uber.org/zap/zapcore"
)

// slogZapCore is a zapcore.Core that forwards entries at or above a minimum
// level to a *slog.Logger, so that etcd's zap logging ends up wherever the
// caller's slog output goes.
//
// Entries whose message is in demote, and all entries once quiet is set, are
// logged at debug level instead: etcd warns about its insecure single-member
// setup on every start and reports its listeners closing as errors on every
// clean shutdown, and neither is news in a dev stack.
type slogZapCore struct {
	log    *slog.Logger
	min    zapcore.LevelEnabler
	demote map[string]bool
	quiet  *atomic.Bool
	fields []zapcore.Field
}

func newSlogZapCore(log *slog.Logger, min zapcore.LevelEnabler, demote []string, quiet *atomic.Bool) zapcore.Core {
	c := &slogZapCore{log: log, min: min, demote: make(map[string]bool, len(demote)), quiet: quiet}
	for _, m := range demote {
		c.demote[m] = true
	}
	return c
}

func (c *slogZapCore) Enabled(l zapcore.Level) bool {
	return c.min.Enabled(l) && c.log.Enabled(context.Background(), slogLevel(l))
}

func (c *slogZapCore) With(fields []zapcore.Field) zapcore.Core {
	nc := *c
	nc.fields = append(append([]zapcore.Field(nil), c.fields...), fields...)
	return &nc
}

func (c *slogZapCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *slogZapCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if (c.demote[ent.Message] || c.quiet.Load()) && !c.log.Enabled(context.Background(), slog.LevelDebug) {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := make([]slog.Attr, 0, len(keys)+1)
	if ent.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", ent.LoggerName))
	}
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	level := slogLevel(ent.Level)
	if c.demote[ent.Message] || c.quiet.Load() {
		level = slog.LevelDebug
	}
	c.log.LogAttrs(context.Background(), level, ent.Message, attrs...)
	return nil
}

func (c *slogZapCore) Sync() error { return nil }

// slogLevel maps a zap level to the closest slog level.
func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}
