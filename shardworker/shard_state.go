// Loading the conversations' state and dedupe keys a batch or the replay needs.

package shardworker

import (
	"context"
	"time"

	"github.com/chatpipe/chatpipe/internal/shardcore"
)

// loadState loads what e asks for in one round trip (plus, for the broken
// order of the fault tests, every conversation of the vshard).
func (s *shard) loadState(ctx context.Context, e *shardcore.Effect) (map[string]*shardcore.Conv, map[shardcore.DedupeKey]shardcore.First, error) {
	convs := e.Convs
	if e.AllOfVShard {
		more, err := s.vshardConversations(ctx)
		if err != nil {
			return nil, nil, err
		}
		have := map[string]bool{}
		for _, c := range convs {
			have[c] = true
		}
		for _, c := range more {
			if !have[c] {
				convs = append(convs, c)
			}
		}
	}
	var loaded map[string]*shardcore.Conv
	var found map[shardcore.DedupeKey]shardcore.First
	var err error
	if l := s.w.loader; l != nil && !e.Abandon && !e.AllOfVShard {
		loaded, found, err = l.load(ctx, convs, e.Keys) // a batch's load: shared with other writers'
	} else {
		loaded, found, err = fetchState(ctx, s.w.cfg.DB, convs, e.Keys)
	}
	if err == nil && e.AllOfVShard {
		s.log.Warn("FAULT: accepting without a takeover marker")
		time.Sleep(faultAcceptDelay)
	}
	return loaded, found, err
}
