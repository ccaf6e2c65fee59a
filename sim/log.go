package sim

import (
	"errors"

	"github.com/chatpipe/chatpipe/logrecord"
)

// ErrFenced is the log's answer to a produce or commit from a producer
// epoch that is no longer the transactional id's current one (Kafka's
// PRODUCER_FENCED / INVALID_PRODUCER_EPOCH).
var ErrFenced = errors.New("sim: producer fenced")

// errCommitUnknown is what a writer sees when the commit reply is lost: the
// outcome is unknown to it (the log may well have committed).
var errCommitUnknown = errors.New("sim: commit outcome unknown")

type recordState int

const (
	recordOpen recordState = iota
	recordCommitted
	recordAborted
)

// Record is one record of the simulated log.
type Record struct {
	Partition     int32
	Offset        int64
	Event         *logrecord.Event
	TxnID         string
	ProducerEpoch int64
	// CommittedStep is the world step of the commit (0 while not committed).
	CommittedStep int
	// ProducedStep is the world step of the produce (the writer decided
	// the event before it).
	ProducedStep int
	state        recordState
}

// Committed reports whether the record's transaction committed.
func (r *Record) Committed() bool { return r.state == recordCommitted }

type producer struct {
	epoch int64
	open  []*Record // records of the open transaction
	inTxn bool
	began int64 // tick the open transaction began
}

// Log is the stand-in for the Kafka topic with transactions: per
// transactional id a producer epoch; InitProducer bumps it and aborts the id's
// open transaction; produce and commit from an older epoch are fenced; a
// transaction open longer than the timeout is aborted and its producer
// fenced; read_committed readers see committed records only, in offset order,
// and nothing at or beyond the first offset of an open transaction (the last
// stable offset).
type Log struct {
	parts     [][]*Record
	producers map[string]*producer
	byConv    map[string][]*Record // committed events per conversation, in commit order

	// Fenced counts produce and commit calls rejected for an old epoch.
	Fenced int
	// TimedOut counts transactions the log aborted for their age.
	TimedOut int
}

// NewLog returns an empty log of n partitions.
func NewLog(n int) *Log {
	return &Log{parts: make([][]*Record, n), producers: map[string]*producer{}, byConv: map[string][]*Record{}}
}

func (l *Log) producer(txnID string) *producer {
	p, ok := l.producers[txnID]
	if !ok {
		p = &producer{}
		l.producers[txnID] = p
	}
	return p
}

// InitProducer starts a new producer session for txnID: the epoch goes up by
// one (fencing every older session) and the open transaction of the id, if
// any, is aborted. It returns the new epoch.
func (l *Log) InitProducer(txnID string) int64 {
	p := l.producer(txnID)
	l.abort(p)
	p.epoch++
	return p.epoch
}

func (l *Log) abort(p *producer) {
	for _, r := range p.open {
		r.state = recordAborted
	}
	p.open, p.inTxn = nil, false
}

// Produce appends e to partition part inside the open transaction of
// (txnID, epoch), beginning one if needed.
func (l *Log) Produce(txnID string, epoch int64, part int32, e *logrecord.Event, now int64) (*Record, error) {
	p := l.producer(txnID)
	if epoch != p.epoch {
		l.Fenced++
		return nil, ErrFenced
	}
	if !p.inTxn {
		p.inTxn, p.began = true, now
	}
	ev := *e
	r := &Record{Partition: part, Offset: int64(len(l.parts[part])), Event: &ev, TxnID: txnID, ProducerEpoch: epoch}
	l.parts[part] = append(l.parts[part], r)
	p.open = append(p.open, r)
	return r, nil
}

// Commit commits the open transaction of (txnID, epoch) at world step step.
func (l *Log) Commit(txnID string, epoch int64, step int) error {
	p := l.producer(txnID)
	if epoch != p.epoch {
		l.Fenced++
		return ErrFenced
	}
	for _, r := range p.open {
		r.state, r.CommittedStep = recordCommitted, step
		if r.Event.HasSeq() {
			l.byConv[r.Event.ConversationID] = append(l.byConv[r.Event.ConversationID], r)
		}
	}
	p.open, p.inTxn = nil, false
	return nil
}

// Abort aborts the open transaction of (txnID, epoch).
func (l *Log) Abort(txnID string, epoch int64) error {
	p := l.producer(txnID)
	if epoch != p.epoch {
		l.Fenced++
		return ErrFenced
	}
	l.abort(p)
	return nil
}

// ExpireTransactions aborts every transaction begun at or before now-timeout
// and bumps its producer's epoch, as Kafka's transaction coordinator does: the
// session that opened it is fenced.
func (l *Log) ExpireTransactions(now, timeout int64) {
	for _, id := range sortedKeys(l.producers) {
		p := l.producers[id]
		if p.inTxn && p.began+timeout <= now {
			l.abort(p)
			p.epoch++
			l.TimedOut++
		}
	}
}

// End is the next offset of partition part.
func (l *Log) End(part int32) int64 { return int64(len(l.parts[part])) }

// StableOffset is the last stable offset of part: the first offset of a
// record whose transaction is still open, or End.
func (l *Log) StableOffset(part int32) int64 {
	for _, r := range l.parts[part] {
		if r.state == recordOpen {
			return r.Offset
		}
	}
	return l.End(part)
}

// ReadCommitted returns, in offset order, the committed records of part
// with from <= offset < to that a read_committed reader can see now, and
// the offset up to which it has read (min(to, last stable offset)).
func (l *Log) ReadCommitted(part int32, from, to int64) ([]*Record, int64) {
	to = min(to, l.StableOffset(part))
	var out []*Record
	for off := max(from, 0); off < to; off++ {
		if r := l.parts[part][off]; r.state == recordCommitted {
			out = append(out, r)
		}
	}
	return out, max(to, from)
}

// ConvRecords returns the committed events of a conversation in commit
// (log) order.
func (l *Log) ConvRecords(conv string) []*Record { return l.byConv[conv] }

// CommittedAt reports whether an event of conv with seq is committed and
// returns the first such record.
func (l *Log) CommittedAt(conv string, seq int64) (*Record, bool) {
	for _, r := range l.byConv[conv] {
		if r.Event.Seq == seq {
			return r, true
		}
	}
	return nil, false
}

// Partitions returns the number of partitions.
func (l *Log) Partitions() int { return len(l.parts) }

// Records returns every record of part, whatever its state.
func (l *Log) Records(part int32) []*Record { return l.parts[part] }
