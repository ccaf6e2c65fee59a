// The overrides a writer is told of, and the release of one whose conversation is home.

package shardworker

import (
	"context"
	"time"

	"github.com/chatpipe/chatpipe/lease"
)

// routeUpdate is one override change for the writer (shardcore's Route
// and Unroute).
type routeUpdate struct {
	conv   string
	to     int
	rev    int64 // the override's mod revision
	routed bool
}

// route queues an override change for the writer; it never blocks.
func (s *shard) route(u routeUpdate) {
	s.rmu.Lock()
	s.routeQ = append(s.routeQ, u)
	s.rmu.Unlock()
	select {
	case s.routeSig <- struct{}{}:
	default:
	}
}

// takeRoutes hands the writer the override changes queued so far.
func (s *shard) takeRoutes() {
	s.rmu.Lock()
	q := s.routeQ
	s.routeQ = nil
	s.rmu.Unlock()
	now := time.Now()
	for _, u := range q {
		if u.routed {
			s.told[u.conv] = lease.Override{VShard: u.to, Rev: u.rev}
			s.m.Route(now, u.conv, u.to)
		} else {
			delete(s.told, u.conv)
			s.m.Unroute(u.conv)
		}
	}
}

// release deletes conversation cid's override, which the writer reports
// here and released to this vshard (Notice.Released), if it is still the
// override the writer last heard of and this writer's owner row is
// unchanged (lease.ReleaseOverride). A delete that fails leaves the
// override: the writer reports it again at its next look.
func (s *shard) release(cid string) {
	o, ok := s.told[cid]
	if !ok || o.VShard != s.v {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, 3*time.Second)
	defer cancel()
	done, err := lease.ReleaseOverride(ctx, s.w.cfg.Etcd, s.w.cfg.Prefix, cid, o.Rev, s.v, s.ownerRev)
	switch {
	case err != nil:
		s.log.Warn("cannot remove the override of a conversation that is home; trying again at the next look", "conversation", cid, "err", err)
	case done:
		s.w.stats.Releases.Add(1)
		s.log.Info("conversation home: override removed", "conversation", cid)
	default:
		s.log.Debug("override changed before its release", "conversation", cid)
	}
}
