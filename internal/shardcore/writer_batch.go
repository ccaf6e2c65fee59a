package shardcore

import (
	"fmt"
	"sort"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// A Writer's batch: collected, its missing state loaded, decided in
// arrival order, committed, and only then answered.

// startBatch takes up to MaxBatch queued commands, answering the ones past
// their deadline, and asks for the state the batch lacks.
func (m *Writer) startBatch(now time.Time) {
	m.collecting, m.wake = false, time.Time{}
	n := min(len(m.queue), m.cfg.MaxBatch)
	for _, c := range m.queue[:n] {
		if c.expired(now) {
			// The gateway gave up on it (its client heard "outcome
			// unknown" and may have retried): deciding it now would apply
			// it late. Nothing was written.
			m.answer(c, Unavailable(c.ReqID, "the command waited past its deadline; nothing was written"), true, false)
			continue
		}
		m.batch = append(m.batch, c)
	}
	clear(m.queue[:n])
	m.queue = m.queue[n:]
	if len(m.queue) == 0 {
		m.queue = m.queue[:0:0]
	}
	if m.movesDue(now) {
		for cid := range m.moves {
			m.batchMoves = append(m.batchMoves, cid)
		}
		sort.Strings(m.batchMoves)
		m.moveWait = min(max(m.moveWait*2, m.cfg.MoveRetry), m.cfg.MoveRetryMax)
		m.moveAt = now.Add(m.moveWait)
	}
	if len(m.batch) == 0 && len(m.batchMoves) == 0 {
		m.idle(now)
		return
	}
	m.decideAt = now
	var need []string
	var keys []DedupeKey
	seenConv, seenKey := map[string]bool{}, map[DedupeKey]bool{}
	for _, cid := range m.batchMoves {
		if !m.cached(cid) {
			seenConv[cid] = true
			need = append(need, cid)
		}
	}
	for _, c := range m.batch {
		cid := c.Cmd.ConversationID
		conv := m.convs[cid]
		// Cached and usable, and not being loaded again for a move.
		loaded := !seenConv[cid] && m.cached(cid)
		if !loaded && !seenConv[cid] {
			seenConv[cid] = true
			need = append(need, cid)
		}
		k := DedupeKey{cid, c.Cmd.ClientMessageID}
		if c.Cmd.ClientMessageID != "" && !seenKey[k] && (!loaded || NeedsDedupeLookup(conv, &c.Cmd)) {
			seenKey[k] = true
			keys = append(keys, k)
		}
	}
	if len(need) > 0 || len(keys) > 0 {
		m.phase = PhaseLoading
		m.effect = &Effect{Kind: EffectLoadState, Convs: need, Keys: keys}
		return
	}
	m.decide(now)
}

// cached reports whether conversation cid's cached state can be used: it
// is cached, and either here or with events persist may not have stored
// yet. A conversation that is not here and whose events are all stored is
// loaded again, for it may have moved (back) here since.
func (m *Writer) cached(cid string) bool {
	conv, ok := m.convs[cid]
	if !ok {
		return false
	}
	return m.here(conv, cid) || m.stored[cid] != nil
}

// stamp is the Stamp of an event decided at now with message id id.
func (m *Writer) stamp(now time.Time, id string) Stamp {
	return Stamp{Now: now, MessageID: id, VShard: m.cfg.VShard, Epoch: m.cfg.Epoch, Dedicated: m.cfg.Dedicated, VShards: m.cfg.VShards}
}

// here reports whether this writer's vshard holds conversation cid, as
// far as its state conv knows.
func (m *Writer) here(conv *Conv, cid string) bool {
	return Stamp{VShard: m.cfg.VShard, Dedicated: m.cfg.Dedicated, VShards: m.cfg.VShards}.Holds(conv, cid)
}

// decide decides the batch in arrival order, applying each event at once
// so that the next command of the conversation sees it, and asks for the
// commit.
func (m *Writer) decide(now time.Time) {
	m.replies = make([]Answer, len(m.batch))
	var seqs int
	decided := false // some answer depends on the conversation's state
	for i, c := range m.batch {
		if c.expired(now) { // collected in time, but the state lookup took the rest
			m.replies[i] = Answer{Call: c, Reply: Unavailable(c.ReqID, "the command waited past its deadline; nothing was written")}
			continue
		}
		conv := m.convs[c.Cmd.ConversationID]
		if conv == nil { // not loaded: cannot happen after a successful load
			conv = NewConv()
			m.convs[c.Cmd.ConversationID] = conv
		}
		if m.cfg.Faults.AcceptBeforeMoved && m.inbound[c.Cmd.ConversationID] && !m.here(conv, c.Cmd.ConversationID) {
			conv.Moved, conv.At = true, m.cfg.VShard
		}
		// A remembered answer of the key, for Decide; one is given again
		// at no cost to the bucket, like a dedupe answer.
		var prior *Verdict
		if v, ok := m.recall(c, now); ok {
			prior = &v
		}
		// (A conversation that is not here is answered retry by Decide
		// and costs its bucket nothing.)
		if wait, ok := m.allowSend(conv, &c.Cmd, prior, now); !ok {
			e := protocol.Errorf(protocol.CodeRateLimited, "more than %g messages/s in %s", m.cfg.ConvRate, c.Cmd.ConversationID)
			e.RetryAfterMS = max(wait.Milliseconds(), 1)
			m.replies[i] = Answer{Call: c, Reply: protocol.Rejected(c.ReqID, e)}
			continue
		}
		id, err := m.cfg.NewID(now)
		if err != nil {
			m.failBatch(now, fmt.Errorf("shardcore: message id: %w", err))
			return
		}
		seen := conv
		if c.members != nil {
			stale := *conv
			stale.Members = c.members
			seen = &stale
		}
		d := DecideWith(seen, &c.Cmd, m.stamp(now, id), m.cfg.Limits, prior)
		if m.cfg.Faults.ForgetNoopJoin && d.Reject == nil && d.Event == nil && c.Cmd.Op == protocol.OpJoin {
			d.Keep = false
		}
		if d.Keep {
			// Another attempt of the key gets this answer too, for a
			// while: one decided later must neither be accepted after a
			// rejection nor take effect after "nothing to do".
			m.stageVerdict(c, VerdictOf(&c.Cmd, d, now))
		}
		switch {
		case d.Retry:
			// Not here: nothing is decided from this state.
			m.replies[i] = Answer{Call: c, Reply: protocol.Rejected(c.ReqID, d.Reject), Retry: true}
			m.notHerePinned(c.Cmd.ConversationID)
			continue
		case d.Reject != nil:
			m.replies[i] = Answer{Call: c, Reply: protocol.Rejected(c.ReqID, d.Reject)}
		case d.Event != nil:
			Apply(conv, d.Event)
			m.events = append(m.events, d.Event)
			seqs++
			seq := d.Event.Seq
			if d.Event.Kind == logrecord.KindRead {
				seq = d.Event.ReadSeq // the marker recorded
			}
			m.replies[i] = Answer{Call: c, Reply: acceptedReply(c, seq, d.Event.MessageID), Wrote: true}
		default:
			m.replies[i] = Answer{Call: c, Reply: acceptedReply(c, d.Seq, d.MessageID)}
		}
		decided = true
	}
	moved, err := m.decideMoves(now)
	if err != nil {
		m.failBatch(now, err)
		return
	}
	seqs += moved
	// A batch that writes nothing still answers from the writer's state (a
	// retry's first result, forbidden, not_found, …), and a writer fenced
	// without knowing it would answer from a stale one: so such a batch
	// commits a takeover marker first, which succeeds only while no other
	// writer has taken the vshard over since this one did.
	if seqs == 0 && (!decided || m.cfg.Faults.NoEmptyBatchMarker) {
		m.answers = append(m.answers, m.replies...)
		m.keepVerdicts(now)
		m.notice.Released = append(m.notice.Released, m.batchReleased...)
		m.endBatch()
		m.housekeepOrIdle(now, false)
		return
	}
	open := false
	if !m.opened {
		// AcceptBeforeMarker: fence and mark only now, the marker last.
		open, m.opened = true, true
		m.events = append(m.events, m.marker(now))
	} else if seqs == 0 {
		m.events = append(m.events, m.marker(now))
	}
	m.phase = PhaseCommitting
	m.effect = &Effect{Kind: EffectCommit, Events: m.events, Open: open}
	if m.cfg.Faults.AcceptedBeforeCommit {
		m.answers = append(m.answers, m.replies...)
		m.replies = nil
	}
}

// decideMoves looks at the batch's conversations routed elsewhere: one
// that is here gets its moved event (after the batch's commands, which
// were decided here); one released to this vshard that is here is noted
// for Notice.Released. It returns how many moved events it added.
func (m *Writer) decideMoves(now time.Time) (int, error) {
	n := 0
	for _, cid := range m.batchMoves {
		to, ok := m.moves[cid]
		if !ok {
			continue // routed here again meanwhile
		}
		conv := m.convs[cid]
		if conv == nil {
			conv = NewConv()
			m.convs[cid] = conv
		}
		if !m.here(conv, cid) {
			m.notHerePinned(cid)
			continue
		}
		if to == m.cfg.VShard {
			// Released to this vshard, and here: the override has done
			// its work.
			m.batchReleased = append(m.batchReleased, cid)
			continue
		}
		{
			id, err := m.cfg.NewID(now)
			if err != nil {
				return n, fmt.Errorf("shardcore: message id: %w", err)
			}
			e := MoveEvent(conv, cid, to, m.stamp(now, id))
			if !m.cfg.Faults.DropCarriedVerdicts {
				e.Verdicts = m.carried(cid, now.Add(-m.cfg.RefusalMemory))
			}
			Apply(conv, e)
			m.events = append(m.events, e)
			n++
		}
	}
	return n, nil
}

// commitDone answers the batch after its commit returned: accepted and the
// other decided answers on success, unavailable on an error.
func (m *Writer) commitDone(now time.Time, offsets []int64, err error) {
	if err != nil {
		m.failBatch(now, fmt.Errorf("shardcore: commit: %w", err))
		return
	}
	m.answers = append(m.answers, m.replies...)
	m.keepVerdicts(now)
	m.notice.Released = append(m.notice.Released, m.batchReleased...)
	for i, e := range m.events {
		if e.HasSeq() && i < len(offsets) {
			m.markUnstored(e.ConversationID, e.Seq, offsets[i])
		}
		if e.Kind == logrecord.KindMoved {
			m.notice.Moved = append(m.notice.Moved, e.ConversationID)
		}
	}
	var cycle time.Duration // from the previous batch's start (none for the first)
	if !m.prevStart.IsZero() {
		cycle = m.batchStart.Sub(m.prevStart)
	}
	m.gc.Observe(len(m.batch), cycle, now.Sub(m.decideAt))
	m.prevStart = m.batchStart
	m.endBatch()
	if m.cancelled {
		m.finish()
		return
	}
	m.housekeepOrIdle(now, true)
}

// notHerePinned notes that conversation cid, not here, is held in the
// cache by events persist may not have stored yet (this writer's own
// moved record): it can be loaded again — it may have moved back since —
// only after persist's offset is read again.
func (m *Writer) notHerePinned(cid string) {
	if m.stored[cid] != nil {
		m.unpin = true
	}
}

// housekeepOrIdle ends a batch: after a commit it reads persist's offset
// to bound the writer's memory when that is due; after any batch when a
// conversation waits to be unpinned (at most once a TrimInterval; the
// next batch that meets it tries again). Otherwise it returns to
// accepting.
func (m *Writer) housekeepOrIdle(now time.Time, committed bool) {
	if m.cancelled {
		m.finish()
		return
	}
	due := now.Sub(m.lastTrim) >= m.cfg.TrimInterval
	if committed && (len(m.convs) > m.cfg.MaxConvs || due) || m.unpin && due {
		m.lastTrim, m.unpin = now, false
		m.phase = PhaseHousekeep
		m.effect = &Effect{Kind: EffectPersistOffset}
		return
	}
	m.afterBatch(now)
}

// failBatch answers the batch in hand unavailable (unless it was answered
// already) and ends the session.
func (m *Writer) failBatch(now time.Time, err error) {
	// (With AcceptedBeforeCommit the batch was answered when its commit
	// was sent.)
	if !(m.cfg.Faults.AcceptedBeforeCommit && m.phase == PhaseCommitting) {
		// Only a commit that was sent may have written the batch's events.
		sent := m.phase == PhaseCommitting
		for i, c := range m.batch {
			wrote := sent && i < len(m.replies) && m.replies[i].Wrote
			m.answer(c, failedReply(c, wrote), false, false)
		}
	}
	m.endBatch()
	m.fail(now, err)
}

// failedReply is the answer to call c of a batch that failed; wrote: c's
// event was in a commit whose outcome is unknown. Another attempt with the
// same ids is safe unless it might apply c a second time: a command
// without a key is not deduplicated, so its client must look at the
// conversation first (docs/protocol.md, "Unknown outcomes"), as the
// gateway tells it when a worker does not answer.
func failedReply(c *Call, wrote bool) *protocol.Reply {
	switch {
	case !wrote:
		return Unavailable(c.ReqID, "the writer failed; nothing was written for this command; retry with the same ids")
	case c.Cmd.ClientMessageID != "" || c.Cmd.Op == protocol.OpRead:
		// Dedupe answers a retry with the first result; a read marker
		// recorded twice is recorded once.
		return Unavailable(c.ReqID, "the writer failed while committing this command; retry with the same ids")
	}
	return Unavailable(c.ReqID, "the outcome of this command is unknown; look at the conversation before sending it again")
}

func (m *Writer) endBatch() {
	m.batch, m.replies, m.events, m.batchMoves, m.batchReleased = nil, nil, nil, nil, nil
	clear(m.batchVerdicts)
	m.batchVerdictOrder = m.batchVerdictOrder[:0]
}

// afterBatch returns to accepting once a batch is over.
func (m *Writer) afterBatch(now time.Time) {
	if m.cancelled {
		m.finish()
		return
	}
	m.idle(now)
}
