// A vshard's writer for one epoch: its state, configuration and command queue.

package shardworker

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/protocol"
)

// replyFunc is a queued command's Tag (shardcore.Call): it is called
// exactly once with the reply; retry means nothing was written and the
// command may go to whoever owns the shard now.
type replyFunc func(r *protocol.Reply, retry bool)

// reply answers c.
func reply(c *shardcore.Call, r *protocol.Reply, retry bool) { c.Tag.(replyFunc)(r, retry) }

// shard drives the writer of one vshard for one ownership epoch: the pure
// state machine shardcore.Writer decides everything, and this loop performs
// its effects against Kafka, etcd and Postgres and feeds the results back.
type shard struct {
	w     *Worker
	v     int
	epoch int64
	// ownerRev is the mod revision of the owner row that started this
	// writer (the row changes only with the epoch): releasing an override
	// is conditional on it.
	ownerRev int64
	part     int32
	log      *slog.Logger

	in     chan *shardcore.Call
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	ready  atomic.Bool
	// dedupeHeld is the number of dedupe results in memory as of the last
	// trim (read by the worker's gauge).
	dedupeHeld atomic.Int64
	hot        hotCounter // committed events per conversation (Worker.Hot)

	m       *shardcore.Writer // owned by run's loop
	cl      *kgo.Client       // the session's transactional producer
	entropy io.Reader

	qmu    sync.Mutex // guards closed against submit racing the final drain
	closed bool

	// Overrides the worker fed in, for run's loop to hand the writer.
	rmu      sync.Mutex
	routeQ   []routeUpdate
	routeSig chan struct{}
	// told is the last override of each conversation handed to the
	// writer (owned by run's loop): a release deletes the override only
	// at the revision the writer last heard of, so that no older route it
	// has yet to act on can follow the delete.
	told map[string]lease.Override
}

func newShard(w *Worker, v int, row lease.Row) *shard {
	ctx, cancel := context.WithCancel(context.Background())
	return &shard{
		w: w, v: v, epoch: row.Epoch, ownerRev: row.ModRevision, part: w.layout().Partition(v), routeSig: make(chan struct{}, 1),
		told: map[string]lease.Override{},
		log:  w.log.With("vshard", v, "epoch", row.Epoch),
		in:   make(chan *shardcore.Call, w.cfg.QueueLen), ctx: ctx, cancel: cancel, done: make(chan struct{}),
		entropy: ulid.Monotonic(rand.Reader, 0),
	}
}

// writerConfig is the state machine's configuration for this shard.
func (s *shard) writerConfig() shardcore.WriterConfig {
	c := s.w.cfg
	return shardcore.WriterConfig{
		VShard: s.v, VShards: c.VShards, Dedicated: s.w.layout().IsDedicated(s.v), Epoch: s.epoch, Worker: c.ID, Limits: c.Limits,
		MaxBatch: c.MaxBatch, Linger: c.Linger, LingerMax: c.LingerMax,
		ConvRate: c.ConvRate, ConvBurst: c.ConvBurst,
		RefusalMemory: c.RefusalMemory, DedupeMemory: c.DedupeMemory, DedupeKeep: c.DedupeKeep,
		MaxConvs: c.MaxConvs, TrimInterval: c.TrimInterval,
		Backoff: 100 * time.Millisecond, BackoffMax: 5 * time.Second, OwnerRetry: 500 * time.Millisecond,
		NewID: func(now time.Time) (string, error) {
			id, err := ulid.New(ulid.Timestamp(now), s.entropy)
			return id.String(), err
		},
		Faults: shardcore.WriterFaults{AcceptBeforeMarker: faultAcceptBeforeMarker},
	}
}

// submit queues c; false when the queue is full.
func (s *shard) submit(c *shardcore.Call) bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.closed {
		return false
	}
	select {
	case s.in <- c:
		return true
	default:
		return false
	}
}

// stop makes the shard stop accepting at once: commands it collected but
// has not decided are answered with a retry, and the batch in hand, if any,
// finishes (the new owner's marker fences its commit anyway).
func (s *shard) stop() { s.cancel() }

func (s *shard) failQueued() {
	s.qmu.Lock()
	s.closed = true
	s.qmu.Unlock()
	for {
		select {
		case c := <-s.in:
			reply(c, shardcore.Unavailable(c.ReqID, "vshard %d is moving to another worker", s.v), true)
		default:
			return
		}
	}
}
