// The driver loop: the writer's answers, notices and effects, one round trip at a time.

package shardworker

import (
	"context"
	"fmt"
	"time"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/lease"
)

// run is the driver loop: act on what the writer asks, then wait for a
// command, its wake-up time or the stop.
func (s *shard) run() {
	defer close(s.done)
	defer s.failQueued()
	defer func() {
		if s.cl != nil {
			s.cl.Close()
		}
	}()
	// Wait for a turn to take over (Config.MaxTakeovers); the commands
	// that arrive meanwhile queue as they would during the takeover. A
	// writer that takes over again (after a failed commit: a broker
	// restart fails every writer's at once) waits for a turn again.
	if !s.waitTurn() {
		return
	}
	turn := true
	endTurn := func() {
		if turn {
			turn = false
			<-s.w.takeovers
		}
	}
	defer endTurn()
	s.m = shardcore.NewWriter(s.writerConfig(), time.Now())
	s.takeRoutes()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	stopped := false
	for {
		rd := s.m.Ready()
		s.act(&rd)
		s.ready.Store(s.m.Accepting())
		if turn && s.m.Accepting() {
			endTurn()
		}
		if rd.Done {
			return
		}
		if !stopped && s.ctx.Err() != nil {
			stopped = true
			s.m.Stop(time.Now())
			if rd.Effect == nil || rd.Effect.Abandon {
				continue
			}
		}
		if rd.Effect != nil {
			if !turn && !stopped && !s.m.Accepting() {
				if turn = s.waitTurn(); !turn {
					stopped = true // as above
					s.m.Stop(time.Now())
					if rd.Effect.Abandon {
						continue
					}
				}
			}
			s.perform(rd.Effect)
			continue
		}
		// Idle: take the override changes and what has queued, then let
		// the writer decide. A writer that always finds commands queued
		// never waits in the select below, and a route it has not taken
		// would have it move a conversation by an override that is gone.
		select {
		case <-s.routeSig:
			s.takeRoutes()
			s.m.Tick(time.Now())
			continue
		default:
		}
		s.m.SetShare(s.w.cfg.TxnBudget / float64(max(s.w.owned.Load(), 1)))
		if s.drain() || (!rd.Wake.IsZero() && !time.Now().Before(rd.Wake)) {
			s.m.Tick(time.Now())
			continue
		}
		var wake <-chan time.Time
		if !rd.Wake.IsZero() {
			timer.Reset(time.Until(rd.Wake))
			wake = timer.C
		}
		select {
		case c := <-s.in:
			s.m.Submit(time.Now(), c)
			s.drain()
			s.m.Tick(time.Now())
		case <-wake:
			s.m.Tick(time.Now())
		case <-s.routeSig:
			s.takeRoutes()
			s.m.Tick(time.Now())
		case <-s.ctx.Done():
		}
		timer.Stop() // (since Go 1.23 a stopped timer delivers no stale tick)
	}
}

// waitTurn takes one of the worker's takeover turns; false if the shard
// was stopped first.
func (s *shard) waitTurn() bool {
	select {
	case s.w.takeovers <- struct{}{}:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// drain hands the writer the commands that have queued, up to a batch.
func (s *shard) drain() bool {
	got := false
	for s.m.Queued() < s.w.cfg.MaxBatch {
		select {
		case c := <-s.in:
			s.m.Submit(time.Now(), c)
			got = true
		default:
			return got
		}
	}
	return got
}

// act sends the writer's answers and counts and logs what it noticed.
func (s *shard) act(rd *shardcore.Ready) {
	for _, a := range rd.Answers {
		reply(a.Call, a.Reply, a.Retry)
	}
	n := &rd.Notice
	if n.TookOver {
		s.w.stats.Takeovers.Add(1)
		s.w.takeoverSeconds.Observe(n.Took.Seconds())
		s.log.Info("accepting", "marker_offset", n.MarkerOffset, "replayed", n.Replayed, "conversations", n.Conversations, "took", n.Took.Round(time.Millisecond))
	}
	if n.Failed != nil && s.ctx.Err() == nil {
		s.log.Warn("shard writer stopped; re-checking ownership before taking over again", "err", n.Failed)
	}
	if n.StateErr != nil {
		s.log.Warn("cannot load conversation state", "err", n.StateErr)
	}
	if n.DedupeHeld >= 0 {
		s.w.stats.DedupeTrimmed.Add(int64(n.Trimmed))
		s.dedupeHeld.Store(int64(n.DedupeHeld))
	}
	for _, cid := range n.Moved {
		s.w.stats.ConvMoves.Add(1)
		s.log.Info("conversation moved out", "conversation", cid)
	}
	for _, cid := range n.Released {
		s.release(cid)
	}
	for _, d := range n.Arrived {
		s.w.arrivalSeconds.Observe(d.Seconds())
		s.log.Info("conversation moved in", "after", d.Round(time.Millisecond))
	}
	if n.Evicted > 0 {
		s.w.stats.Evictions.Add(int64(n.Evicted))
		s.log.Debug("evicted conversations", "n", n.Evicted)
	}
}

// perform makes one round trip for the writer and feeds its result back.
func (s *shard) perform(e *shardcore.Effect) {
	switch e.Kind {
	case shardcore.EffectOpenProducer:
		s.m.ProducerOpened(time.Now(), s.openProducer())
	case shardcore.EffectCommit:
		offs, err := s.commitEvents(e)
		s.m.Committed(time.Now(), offs, err)
	case shardcore.EffectPersistOffset:
		ctx, cancel := s.effectContext(e)
		off, ok, err := s.w.persistOffset(ctx, s.part)
		cancel()
		s.m.PersistOffset(time.Now(), off, ok, err)
	case shardcore.EffectReadTail:
		ctx, cancel := s.effectContext(e)
		tail, err := s.readTail(ctx, e)
		cancel()
		s.m.TailRead(time.Now(), tail, err)
	case shardcore.EffectLoadState:
		ctx, cancel := s.effectContext(e)
		convs, found, err := s.loadState(ctx, e)
		cancel()
		// The state may show a move that an override change queued
		// meanwhile led to (its writer was told at the same time): the
		// writer decides with that change, not with the route it had.
		s.takeRoutes()
		s.m.StateLoaded(time.Now(), convs, found, err)
	case shardcore.EffectReadOwner:
		// After a fence only the owner may make a new producer: a zombie
		// that re-opened its producer would fence the real owner. (A pause
		// between this read and the re-open can still fence a new owner
		// for a moment — the marker's Confirm then keeps the zombie from
		// committing; the new owner re-checks and fences back, and every
		// answer waits for a commit, so no stale answer gets out.)
		still, err := s.stillOwner()
		s.m.OwnerRead(time.Now(), still, err)
	default:
		panic(fmt.Sprintf("shardworker: unknown effect %v", e.Kind))
	}
}

// stillOwner reads the vshard's owner row (a linearizable read) and
// reports whether it still names this worker, its registration and this
// writer's epoch.
func (s *shard) stillOwner() (bool, error) {
	ctx, cancel := context.WithTimeout(s.ctx, 3*time.Second)
	defer cancel()
	o, ok, err := lease.ReadOwner(ctx, s.w.cfg.Etcd, s.w.cfg.Prefix, s.v)
	return ok && o.Worker == s.w.cfg.ID && o.Gen == s.w.gen.Load() && o.Epoch == s.epoch, err
}

// effectContext bounds one round trip: the replay's steps by ReplayTimeout
// and the stop (they may be abandoned), the others by CommitTimeout only.
func (s *shard) effectContext(e *shardcore.Effect) (context.Context, context.CancelFunc) {
	if e.Abandon {
		return context.WithTimeout(s.ctx, s.w.cfg.ReplayTimeout)
	}
	return context.WithTimeout(context.Background(), s.w.cfg.CommitTimeout)
}
