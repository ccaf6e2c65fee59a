package shardcore

import (
	"sort"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// Command is a client command as the shard writer sees it. Sender is the
// authenticated user, never a field the client sent.
type Command struct {
	Op              string
	ConversationID  string
	Sender          string
	UserID          string
	ClientMessageID string
	Body            string
	Members         []string
	// Seq is read's marker: the sender has read the conversation up to it.
	Seq int64
}

// First is the first result of a command that carried a client_message_id
// (every send; create, join, kick and leave when the client gave one),
// remembered for dedupe.
type First struct {
	Seq       int64
	MessageID string
	Sender    string
	// Kind is the event's kind ("" is read as a message: results kept
	// before membership commands carried keys).
	Kind string
	// At is the event's created_at: how old the entry is, for TrimDedupe.
	At time.Time
}

// Conv is what the writer knows of one conversation.
type Conv struct {
	Exists  bool
	Owner   string
	LastSeq int64
	// Members maps each current member to the seq of the event that made
	// them one.
	Members map[string]int64
	// Dedupe holds the first result of the sends the writer has seen in the
	// log tail, written itself, or looked up in durable state, that
	// TrimDedupe has not dropped yet. Add entries with Remember.
	Dedupe map[string]First
	// order lists Dedupe's keys oldest first, from head on.
	order []string
	head  int
	// Known, when set, holds every client_message_id the conversation had
	// in durable state when it was loaded, and each one TrimDedupe has
	// dropped from Dedupe since: a key in neither Dedupe nor Known was
	// never used, and needs no lookup (NeedsDedupeLookup). nil: any key
	// missing from Dedupe is looked up. Set it with KnowKeys.
	Known *KeyFilter
	// Moved: a moved event was applied, and At is the vshard it moved the
	// conversation to. Without one the conversation is at its hashed
	// vshard.
	Moved bool
	At    int
	// MovedAt is the created_at of that moved event.
	MovedAt time.Time
	// Verdicts are the ones that moved event carried: the answers its
	// writer remembered for the conversation's keys (the writer it moved
	// to adopts them).
	Verdicts []logrecord.Verdict
}

// Holds reports whether conversation cid, whose state is c, is written by
// st's vshard, as far as c knows: the target of its last moved event, or,
// never moved, its hashed vshard (with VShards 0, any vshard that is not
// dedicated).
func (st Stamp) Holds(c *Conv, cid string) bool {
	switch {
	case c.Moved:
		return c.At == st.VShard
	case st.Dedicated:
		return false
	case st.VShards > 0:
		return logrecord.VShard(cid, st.VShards) == st.VShard
	}
	return true
}

// Verdict is the answer to a command with a client_message_id that wrote
// nothing and is final for the key: a rejection, or the acceptance of a
// join of a current member. The log keeps no trace of either, so the
// driver remembers it for a while (Decision.Keep) and hands it to
// DecideWith for another attempt of the key: one that reaches the writer
// late then gets the same answer instead of being decided again against a
// state that changed since (docs/protocol.md, "Attempts in flight").
type Verdict struct {
	Sender string
	Op     string
	// Err is the rejection; nil: accepted without a write, at Seq (the
	// join that made the user a member).
	Err *protocol.Error
	Seq int64
	// At is when it was decided.
	At time.Time
}

// VerdictOf is the verdict d, decided for cmd at now, leaves for cmd's key
// (meaningful when d.Keep).
func VerdictOf(cmd *Command, d Decision, now time.Time) Verdict {
	return Verdict{Sender: cmd.Sender, Op: cmd.Op, Err: d.Reject, Seq: d.Seq, At: now}
}

func (v *Verdict) decision() Decision {
	if v.Err != nil {
		return Decision{Reject: v.Err}
	}
	return Decision{Seq: v.Seq}
}

// NewConv returns the state of a conversation with no events.
func NewConv() *Conv {
	return &Conv{Members: map[string]int64{}, Dedupe: map[string]First{}}
}

// Remember records f as the first result of client_message_id cmid, unless
// one is known already (the first result always wins).
func Remember(c *Conv, cmid string, f First) {
	if _, ok := c.Dedupe[cmid]; ok {
		return
	}
	c.Dedupe[cmid] = f
	c.order = append(c.order, cmid)
}

// KnowKeys gives c, a conversation just loaded from durable state, the
// filter of keys: every client_message_id its stored events carry (the
// dedupe map holds the rest). Without it every key missing from Dedupe is
// looked up.
func KnowKeys(c *Conv, keys []string) {
	c.Known = NewKeyFilter(keys)
}

// TrimDedupe bounds the memory of c's dedupe: it drops the oldest entries
// while more than keep are held or they were created before cutoff, but
// never an entry above storedSeq, the highest seq known to be in durable
// state. A dropped entry is found again by a lookup in durable state (see
// NeedsDedupeLookup), so trimming never changes an answer; an entry the
// durable state does not hold yet stays, however old. A dropped key goes
// into c.Known, when c has one, which must go on answering "maybe" for it.
// It returns how many entries it dropped.
func TrimDedupe(c *Conv, storedSeq int64, keep int, cutoff time.Time) int {
	n := 0
	for c.head < len(c.order) {
		k := c.order[c.head]
		f := c.Dedupe[k]
		if f.Seq > storedSeq || (len(c.Dedupe) <= keep && !f.At.Before(cutoff)) {
			break
		}
		if c.Known != nil {
			c.Known.Add(k)
		}
		delete(c.Dedupe, k)
		c.order[c.head] = ""
		c.head++
		n++
	}
	if c.head == len(c.order) {
		c.order, c.head = c.order[:0], 0
	} else if c.head > 64 && c.head > len(c.order)/2 {
		c.order = append(c.order[:0], c.order[c.head:]...)
		c.head = 0
	}
	return n
}

// Stamp is what Decide needs from outside for a new event: the time and a
// fresh message id. The driver makes it; tests pass fixed values.
type Stamp struct {
	Now       time.Time
	MessageID string
	VShard    int
	Epoch     int64
	// Dedicated: VShard is a dedicated vshard, which writes only the
	// conversations moved to it. VShards is the number of hashed vshards
	// (0: unknown; a vshard that is not dedicated then holds every
	// conversation that never moved).
	Dedicated bool
	VShards   int
}

// Decision is the outcome of Decide: exactly one of Reject, Event, or an
// answer that writes nothing (Seq and MessageID of an earlier event).
type Decision struct {
	Reject *protocol.Error
	// Event is to be committed to the log; the reply waits for the commit.
	Event *logrecord.Event
	// Seq and MessageID answer without writing (a retried send, or a join
	// of a current member).
	Seq       int64
	MessageID string
	// Retry (with Reject): the conversation is not written here (it moved
	// away, or has not arrived yet); nothing was written, and the command
	// may be sent again to where it is routed then.
	Retry bool
	// Keep: the command carries a client_message_id and the answer, which
	// wrote nothing, is final for it (a rejection, or a join of a current
	// member): the driver remembers it as the key's Verdict (VerdictOf)
	// and passes it to DecideWith for the key's other attempts.
	Keep bool
}

// Limits the core enforces.
type Limits struct {
	MaxMembers int
}

// NeedsDedupeLookup reports whether the durable state must be asked about
// cmd's client_message_id before Decide: the key is not in c's dedupe map,
// and c's filter of known keys (if it has one) cannot rule it out.
func NeedsDedupeLookup(c *Conv, cmd *Command) bool {
	if cmd.ClientMessageID == "" {
		return false
	}
	if _, ok := c.Dedupe[cmd.ClientMessageID]; ok {
		return false
	}
	return c.Known == nil || c.Known.MayHold(cmd.ClientMessageID)
}

// Decide returns what to do with cmd given c, as a first attempt of its
// key: DecideWith without a remembered verdict. It changes nothing.
func Decide(c *Conv, cmd *Command, st Stamp, lim Limits) Decision {
	return DecideWith(c, cmd, st, lim, nil)
}

// DecideWith returns what to do with cmd given c and prior, the verdict the
// driver remembers for cmd's key (nil: none). It changes nothing.
func DecideWith(c *Conv, cmd *Command, st Stamp, lim Limits, prior *Verdict) Decision {
	// Dedupe answers before any other check (docs/protocol.md): a retried
	// command gets its first result, whatever happened since, so one
	// command never takes effect twice.
	if cmd.ClientMessageID != "" {
		if f, ok := c.Dedupe[cmd.ClientMessageID]; ok {
			if f.Sender != cmd.Sender {
				return reject(protocol.CodeConflict, "client_message_id %s was used by another sender in %s", cmd.ClientMessageID, cmd.ConversationID)
			}
			if kind := opKind[cmd.Op]; kind != f.kind() {
				return reject(protocol.CodeConflict, "client_message_id %s was used for a %s in %s", cmd.ClientMessageID, f.kind(), cmd.ConversationID)
			}
			return Decision{Seq: f.Seq, MessageID: f.MessageID}
		}
	}
	// A conversation that moved away (or has not arrived) is decided by
	// its new vshard's writer alone, from the state this one committed up
	// to its moved record. A first result above is still true here: it
	// never changes. A remembered verdict is not: the new writer may
	// have decided the key since.
	if !st.Holds(c, cmd.ConversationID) {
		e := protocol.Errorf(protocol.CodeUnavailable, "%s is moving between vshards; retry with the same ids", cmd.ConversationID)
		e.RetryAfterMS = 50
		return Decision{Reject: e, Retry: true}
	}
	// An answer to this key decided a moment ago that wrote nothing
	// stands: the client may have been told it, and an attempt that
	// arrives late (one the gateway gave up on, or that a client's re-send
	// overtook) must neither be accepted after a rejection nor take effect
	// after "accepted, nothing to do" (docs/protocol.md, "Attempts in
	// flight").
	if prior != nil && cmd.ClientMessageID != "" && prior.Sender == cmd.Sender && prior.Op == cmd.Op {
		return prior.decision()
	}
	d := decideState(c, cmd, st, lim)
	// What writes nothing here is a rejection or a join of a member.
	d.Keep = cmd.ClientMessageID != "" && d.Event == nil
	return d
}

// decideState decides cmd from c's state alone: dedupe, the location and a
// remembered verdict have been looked at.
func decideState(c *Conv, cmd *Command, st Stamp, lim Limits) Decision {
	_, isMember := c.Members[cmd.Sender]
	ev := &logrecord.Event{
		V:              logrecord.VersionOf(logrecord.KindMessage),
		ConversationID: cmd.ConversationID,
		Seq:            c.LastSeq + 1,
		MessageID:      st.MessageID,
		Sender:         cmd.Sender,
		CreatedAt:      st.Now.UTC(),
		VShard:         st.VShard,
		Epoch:          st.Epoch,
	}
	switch cmd.Op {
	case protocol.OpCreate:
		if c.Exists {
			return reject(protocol.CodeConflict, "conversation %s exists", cmd.ConversationID)
		}
		members := uniqueMembers(cmd.Sender, cmd.Members)
		if len(members) > lim.MaxMembers {
			return reject(protocol.CodeTooLarge, "more than %d members", lim.MaxMembers)
		}
		ev.Kind, ev.Members, ev.ClientMessageID = logrecord.KindCreate, members, cmd.ClientMessageID
	case protocol.OpSend:
		if !isMember {
			return reject(protocol.CodeForbidden, "%s is not a member of %s", cmd.Sender, cmd.ConversationID)
		}
		ev.Kind, ev.ClientMessageID, ev.Body = logrecord.KindMessage, cmd.ClientMessageID, cmd.Body
	case protocol.OpJoin:
		if !isMember {
			return reject(protocol.CodeForbidden, "%s is not a member of %s", cmd.Sender, cmd.ConversationID)
		}
		if seq, ok := c.Members[cmd.UserID]; ok {
			// Nothing to do: answered with the join that made them a
			// member (kept as the key's verdict when keyed).
			return Decision{Seq: seq}
		}
		if len(c.Members)+1 > lim.MaxMembers {
			return reject(protocol.CodeTooLarge, "%s has %d members already", cmd.ConversationID, len(c.Members))
		}
		ev.Kind, ev.UserID, ev.ClientMessageID = logrecord.KindJoin, cmd.UserID, cmd.ClientMessageID
	case protocol.OpKick:
		if !c.Exists || c.Owner != cmd.Sender || !isMember {
			return reject(protocol.CodeForbidden, "only the owner of %s may kick", cmd.ConversationID)
		}
		if cmd.UserID == cmd.Sender {
			return reject(protocol.CodeForbidden, "the owner cannot kick themselves; use leave")
		}
		if _, ok := c.Members[cmd.UserID]; !ok {
			return reject(protocol.CodeNotFound, "%s is not a member of %s", cmd.UserID, cmd.ConversationID)
		}
		ev.Kind, ev.UserID, ev.ClientMessageID = logrecord.KindKick, cmd.UserID, cmd.ClientMessageID
	case protocol.OpLeave:
		if !isMember {
			return reject(protocol.CodeNotFound, "%s is not a member of %s", cmd.Sender, cmd.ConversationID)
		}
		ev.Kind, ev.UserID, ev.ClientMessageID = logrecord.KindLeave, cmd.Sender, cmd.ClientMessageID
	case protocol.OpRead:
		// A read marker takes no seq and carries no key: recording it
		// again changes nothing, and the highest one recorded stands.
		if !isMember {
			return reject(protocol.CodeForbidden, "%s is not a member of %s", cmd.Sender, cmd.ConversationID)
		}
		if cmd.Seq < 1 || cmd.Seq > c.LastSeq {
			return reject(protocol.CodeBadRequest, "seq %d is not a seq of %s (its last is %d)", cmd.Seq, cmd.ConversationID, c.LastSeq)
		}
		return Decision{Event: &logrecord.Event{
			V: logrecord.VersionOf(logrecord.KindRead), Kind: logrecord.KindRead, ConversationID: cmd.ConversationID,
			Sender: cmd.Sender, UserID: cmd.Sender, ReadSeq: cmd.Seq, CreatedAt: st.Now.UTC(),
			VShard: st.VShard, Epoch: st.Epoch,
		}}
	default:
		return reject(protocol.CodeBadRequest, "op %q is not a write", cmd.Op)
	}
	return Decision{Event: ev}
}

// Apply changes c by one committed (or about to be committed) event. Events
// at or below LastSeq change nothing but the dedupe map, so applying the
// durable prefix and then an overlapping log tail is safe.
func Apply(c *Conv, e *logrecord.Event) {
	if !e.HasSeq() {
		return // a takeover or read marker: nothing of the conversation
	}
	if e.ClientMessageID != "" {
		Remember(c, e.ClientMessageID, First{Seq: e.Seq, MessageID: e.MessageID, Sender: e.Sender, Kind: e.Kind, At: e.CreatedAt})
	}
	if e.Seq <= c.LastSeq {
		return
	}
	c.LastSeq = e.Seq
	switch e.Kind {
	case logrecord.KindCreate:
		c.Exists, c.Owner = true, e.Sender
		for _, m := range e.Members {
			c.Members[m] = e.Seq
		}
		c.Members[e.Sender] = e.Seq
	case logrecord.KindJoin:
		c.Exists = true
		if _, ok := c.Members[e.UserID]; !ok {
			c.Members[e.UserID] = e.Seq
		}
	case logrecord.KindKick, logrecord.KindLeave:
		delete(c.Members, e.UserID)
	case logrecord.KindMoved:
		if e.ToVShard != nil {
			c.Moved, c.At, c.MovedAt, c.Verdicts = true, *e.ToVShard, e.CreatedAt, e.Verdicts
		}
	}
}

// MoveEvent is the moved event that ends conversation c's stay in the
// vshard of st: it takes the next seq and names the vshard to that writes
// the conversation's next events.
func MoveEvent(c *Conv, cid string, to int, st Stamp) *logrecord.Event {
	return &logrecord.Event{
		V: logrecord.VersionOf(logrecord.KindMoved), Kind: logrecord.KindMoved, ConversationID: cid,
		Seq: c.LastSeq + 1, MessageID: st.MessageID, CreatedAt: st.Now.UTC(),
		VShard: st.VShard, Epoch: st.Epoch, ToVShard: &to,
	}
}

// ObserveSeq raises LastSeq to seq: the durable state says events up to seq
// exist (messages are not replayed one by one on load).
func ObserveSeq(c *Conv, seq int64) {
	if seq > c.LastSeq {
		c.LastSeq = seq
	}
}

// opKind is the event kind each write op commits.
var opKind = map[string]string{
	protocol.OpCreate: logrecord.KindCreate, protocol.OpJoin: logrecord.KindJoin, protocol.OpKick: logrecord.KindKick,
	protocol.OpLeave: logrecord.KindLeave, protocol.OpSend: logrecord.KindMessage,
}

func (f First) kind() string {
	if f.Kind == "" {
		return logrecord.KindMessage
	}
	return f.Kind
}

func uniqueMembers(owner string, members []string) []string {
	seen := map[string]bool{owner: true}
	out := []string{owner}
	rest := make([]string, 0, len(members))
	for _, m := range members {
		if !seen[m] {
			seen[m] = true
			rest = append(rest, m)
		}
	}
	sort.Strings(rest)
	return append(out, rest...)
}

func reject(code protocol.Code, format string, args ...any) Decision {
	return Decision{Reject: protocol.Errorf(code, format, args...)}
}
