package sim

import (
	"strings"
	"testing"
)

// zeroChooser takes the first alternative of every choice: a scripted
// schedule makes its choices by naming actions.
type zeroChooser struct{}

func (zeroChooser) Choose(int, string) int { return 0 }

// script drives a world step by step by the names of its actions, for
// schedules written by hand.
type script struct {
	t *testing.T
	w *World
}

// oneShard is the smallest deployment: one vshard, one partition, two
// workers, one conversation. setup gives the vshard to w0.
func oneShard() Config {
	cfg := DefaultConfig()
	cfg.VShards, cfg.Partitions, cfg.Workers, cfg.Conversations = 1, 1, 2, 1
	return cfg
}

func newScript(t *testing.T, cfg Config) *script {
	w := newWorld(cfg, zeroChooser{})
	w.setup()
	return &script{t: t, w: w}
}

// do runs, for each prefix, the first action whose name starts with it.
func (s *script) do(prefixes ...string) {
	s.t.Helper()
	for _, p := range prefixes {
		if !s.try(p) {
			var names []string
			for c := category(0); c < numCategories; c++ {
				for _, a := range s.w.actions(c) {
					names = append(names, a.name())
				}
			}
			s.t.Fatalf("no action %q now; the world can do:\n  %s\ntrace:\n  %s", p, strings.Join(names, "\n  "), strings.Join(s.w.trace, "\n  "))
		}
	}
}

func (s *script) try(prefix string) bool {
	for c := category(0); c < numCategories; c++ {
		for _, a := range s.w.actions(c) {
			if strings.HasPrefix(a.name(), prefix) {
				s.w.run(a)
				return true
			}
		}
	}
	return false
}

// clock advances the clock by n ticks, one at a time.
func (s *script) clock(n int) {
	s.t.Helper()
	for i := 0; i < n; i++ {
		s.do("clock")
	}
}

// message finds the request (or reply) of op id in flight.
func (s *script) message(id int, request bool) *message {
	s.t.Helper()
	for _, m := range s.w.net.inflight {
		if m.att.op.id == id && (m.to != "") == request {
			return m
		}
	}
	s.t.Fatalf("no message of op%d in flight (request %v)", id, request)
	return nil
}

func (s *script) deliver(id int, request bool) {
	s.t.Helper()
	m := s.message(id, request)
	s.w.run(action{format: "deliver %s", args: []any{m}, do: func() { s.w.deliver(m) }})
}

func (s *script) drop(id int, request bool) {
	s.t.Helper()
	m := s.message(id, request)
	s.w.run(action{format: "DROP %s", args: []any{m}, do: func() { s.w.net.remove(m) }})
}
