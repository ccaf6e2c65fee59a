package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/chatpipe/chatpipe/internal/delivery"
	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/internal/ownership"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/protocol"
)

// The production types satisfy the gateway's interfaces.
var (
	_ Owners    = (*lease.Watcher)(nil)
	_ Link      = (*link.Client)(nil)
	_ ReadModel = (*delivery.Store)(nil)
)

// fakeOwners is an ownership view the test changes: the worker of a vshard
// is named by its address.
type fakeOwners struct {
	mu      sync.Mutex
	rows    map[int]ownership.Row
	changed chan struct{}
}

func newFakeOwners() *fakeOwners {
	return &fakeOwners{rows: map[int]ownership.Row{}, changed: make(chan struct{})}
}

// set makes addr the owner of vshard v at epoch.
func (o *fakeOwners) set(v int, addr string, epoch int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rows[v] = ownership.Row{Owner: ownership.Owner{Worker: addr, Gen: 1, Epoch: epoch}}
	close(o.changed)
	o.changed = make(chan struct{})
}

func (o *fakeOwners) Route(v int) (ownership.Row, ownership.WorkerInfo, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	row, ok := o.rows[v]
	if !ok {
		return ownership.Row{}, ownership.WorkerInfo{}, false
	}
	return row, ownership.WorkerInfo{Addr: row.Worker, Gen: row.Gen}, true
}

func (o *fakeOwners) Override(string) (int, bool) { return 0, false }

func (o *fakeOwners) Changed() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.changed
}

// answerFunc is a fake worker: how it answers one command.
type answerFunc func(ctx context.Context, user string, req *protocol.Request) (*link.Response, error)

// fakeLink is one link to a fake worker.
type fakeLink struct {
	addr   string
	answer answerFunc

	mu    sync.Mutex
	calls []*protocol.Request
	ctxs  []context.Context

	done chan struct{}
	once sync.Once
}

func (l *fakeLink) Do(ctx context.Context, user string, req *protocol.Request) (*link.Response, error) {
	select {
	case <-l.done:
		return nil, fmt.Errorf("%w: %w", link.ErrNotSent, link.ErrClosed)
	default:
	}
	l.mu.Lock()
	l.calls = append(l.calls, req)
	l.ctxs = append(l.ctxs, ctx)
	l.mu.Unlock()
	return l.answer(ctx, user, req)
}

func (l *fakeLink) Done() <-chan struct{} { return l.done }

func (l *fakeLink) Close() { l.once.Do(func() { close(l.done) }) }

// fakeNet dials fake workers by address.
type fakeNet struct {
	mu      sync.Mutex
	workers map[string]answerFunc
	links   map[string][]*fakeLink
}

func newFakeNet() *fakeNet {
	return &fakeNet{workers: map[string]answerFunc{}, links: map[string][]*fakeLink{}}
}

// worker makes addr answer with f.
func (n *fakeNet) worker(addr string, f answerFunc) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.workers[addr] = f
}

func (n *fakeNet) dial(ctx context.Context, addr string, _ link.Config) (Link, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f := n.workers[addr]
	if f == nil {
		return nil, errors.New("connection refused")
	}
	l := &fakeLink{addr: addr, answer: f, done: make(chan struct{})}
	n.links[addr] = append(n.links[addr], l)
	return l, nil
}

// dials counts the links opened to addr.
func (n *fakeNet) dials(addr string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.links[addr])
}

// calls returns the commands addr got, over all its links.
func (n *fakeNet) calls(addr string) []*protocol.Request {
	n.mu.Lock()
	links := n.links[addr]
	n.mu.Unlock()
	var out []*protocol.Request
	for _, l := range links {
		l.mu.Lock()
		out = append(out, l.calls...)
		l.mu.Unlock()
	}
	return out
}

// acceptAs answers every command accepted at seq, with the worker's
// address as the message id (to tell who answered).
func acceptAs(addr string, seq int64) answerFunc {
	return func(_ context.Context, _ string, req *protocol.Request) (*link.Response, error) {
		return &link.Response{Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: req.ID, ConversationID: req.ConversationID,
			Seq: seq, MessageID: addr, ClientMessageID: req.ClientMessageID}}, nil
	}
}

// retryAnswer is a worker's "not mine, nothing written".
func retryAnswer(req *protocol.Request, msg string) *link.Response {
	return &link.Response{Retry: true, Reply: protocol.Rejected(req.ID, protocol.Errorf(protocol.CodeUnavailable, "%s", msg))}
}

// fakeReads is a read model in memory.
type fakeReads struct {
	mu sync.Mutex

	syncRes   *delivery.SyncResult
	syncErr   error
	syncArgs  []any // user, cursors, limit of the last Sync
	history   []*protocol.Event
	histErr   error
	histArgs  []any // user, conv, beforeSeq, limit of the last History
	histCover int64 // what Covered said for the history's conversation when History was called
	convs     []*protocol.ConversationInfo
	open      map[string]int
	openErr   error
	openArgs  []any // users, except of the last OpenMemberships
	covered   map[string]int64
	coverAsks int
	// stored: the events Since reads back (every user may see them);
	// sinceCalls counts its calls.
	stored     []*protocol.Event
	sinceCalls int
	marks      map[string]int64 // the user's read markers Since reports
	gate       chan struct{}    // when set, Since waits for it to close
	entered    chan struct{}    // when set, Since signals it (without blocking) on entry
}

func (f *fakeReads) Since(_ context.Context, user string, cursors map[string]int64, limit int) (*delivery.SyncResult, error) {
	f.mu.Lock()
	gate, entered := f.gate, f.entered
	f.mu.Unlock()
	if entered != nil {
		select {
		case entered <- struct{}{}:
		default:
		}
	}
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sinceCalls++
	res := &delivery.SyncResult{Cursors: map[string]int64{}}
	for c := range cursors {
		if seq, ok := f.marks[c]; ok {
			if res.Read == nil {
				res.Read = map[string]int64{}
			}
			res.Read[c] = seq
		}
	}
	for _, e := range f.stored {
		cur, ok := cursors[e.ConversationID]
		if !ok {
			continue
		}
		res.Cursors[e.ConversationID] = max(res.Cursors[e.ConversationID], cur)
		if e.Seq <= cur {
			continue
		}
		if len(res.Events) == limit {
			res.More = true
			continue
		}
		c := *e
		res.Events = append(res.Events, &c)
		res.Cursors[e.ConversationID] = e.Seq
	}
	return res, nil
}

func (f *fakeReads) Sync(_ context.Context, user string, cursors map[string]int64, limit int) (*delivery.SyncResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncArgs = []any{user, cursors, limit}
	return f.syncRes, f.syncErr
}

func (f *fakeReads) History(_ context.Context, user, conv string, beforeSeq int64, limit int) ([]*protocol.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.histArgs = []any{user, conv, beforeSeq, limit}
	f.histCover = f.covered[conv]
	return f.history, f.histErr
}

func (f *fakeReads) Conversations(_ context.Context, user string, limit int) ([]*protocol.ConversationInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.convs, nil
}

func (f *fakeReads) OpenMemberships(_ context.Context, users []string, except string) (map[string]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.openArgs = []any{users, except}
	return f.open, f.openErr
}

func (f *fakeReads) Covered(_ context.Context, convs []string) (map[string]int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.coverAsks++
	out := map[string]int64{}
	for _, c := range convs {
		if s, ok := f.covered[c]; ok {
			out[c] = s
		}
	}
	return out, nil
}

// lastHistory returns the last History call's arguments and what Covered
// said for its conversation then.
func (f *fakeReads) lastHistory() ([]any, int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.histArgs, f.histCover
}

// cover sets the seq up to which the read model includes conv.
func (f *fakeReads) cover(conv string, seq int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.covered == nil {
		f.covered = map[string]int64{}
	}
	f.covered[conv] = seq
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
