package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"sync"
	"testing"
	"time"

	chatclient "github.com/chatpipe/chatpipe/client"
	"github.com/chatpipe/chatpipe/internal/readmodel"
	"github.com/chatpipe/chatpipe/internal/worldcheck"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// frame is any server frame (a superset of their fields).
type frame struct {
	Op             string                       `json:"op"`
	ID             string                       `json:"id"`
	Code           string                       `json:"code"`
	Message        string                       `json:"message"`
	RetryAfterMS   int64                        `json:"retry_after_ms"`
	ConversationID string                       `json:"conversation_id"`
	Seq            int64                        `json:"seq"`
	MessageID      string                       `json:"message_id"`
	Cursors        map[string]int64             `json:"cursors"`
	More           bool                         `json:"more"`
	Events         []*protocol.Event            `json:"events"`
	Conversations  []*protocol.ConversationInfo `json:"conversations"`
}

// device is one device of a user: a websocket that comes and goes, and a
// view of its conversations built only from what the server pushed (event),
// sync and history. It dedupes by (conversation_id, seq) as clients must.
type device struct {
	t    *testing.T
	dev  *devProc
	user string
	name string
	url  string // websocket URL (default: the dev process's gateway)

	connMu  sync.Mutex // one connect at a time
	mu      sync.Mutex
	conn    *chatclient.Conn // nil after disconnect; may have ended (see current)
	view    map[string]map[int64]*protocol.Event
	cursors map[string]int64 // from synced replies only: never past a hole
	syncing int
	live    []time.Duration // created_at → received, for events not fetched by sync
	conns   int
}

func newDevice(t *testing.T, dev *devProc, user, name string) *device {
	return &device{t: t, dev: dev, user: user, name: name,
		view: map[string]map[int64]*protocol.Event{}, cursors: map[string]int64{}}
}

// connect dials (unless connected) and syncs until the server says there is
// no more. A connection lost during the sync is dialled again.
func (d *device) connect() error {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	for {
		err := d.connectOnce()
		if err != errClosed {
			return err
		}
	}
}

func (d *device) connectOnce() error {
	if d.current() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := d.url
	if url == "" {
		url = d.dev.EP.WebSocket
	}
	c, err := chatclient.DialConn(ctx, url, chatclient.ConnOptions{Token: d.dev.Token(d.t, d.user), ReadLimit: 1 << 20, OnFrame: d.pushed})
	if err != nil {
		return fmt.Errorf("dial %s: %w", d.name, err)
	}
	d.mu.Lock()
	d.conn = c
	d.conns++
	d.mu.Unlock()
	return d.syncAll()
}

// current is the open connection, or nil.
func (d *device) current() *chatclient.Conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil && d.conn.Err() != nil {
		d.conn = nil
	}
	return d.conn
}

// disconnect closes the current connection (abruptly) and waits for its
// reader to end.
func (d *device) disconnect() {
	d.mu.Lock()
	c := d.conn
	d.conn = nil
	d.mu.Unlock()
	if c != nil {
		c.CloseNow()
	}
}

// pushed handles a frame that answers no request: an event is recorded.
// It runs on the connection's reader, in order with the answers, so a
// sync's events are recorded before its synced answer is handed over.
func (d *device) pushed(b []byte) {
	f := &frame{}
	if err := json.Unmarshal(b, f); err != nil {
		d.t.Errorf("%s: bad frame %s", d.name, b)
		return
	}
	if f.Op != protocol.OpEvent {
		return
	}
	e := &protocol.Event{}
	if err := json.Unmarshal(b, e); err != nil {
		d.t.Errorf("%s: bad event %s", d.name, b)
	}
	d.record(e, true)
}

// record adds an event to the view; a different event at a seq already
// seen is a broken invariant.
func (d *device) record(e *protocol.Event, pushed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.view[e.ConversationID]
	if m == nil {
		m = map[int64]*protocol.Event{}
		d.view[e.ConversationID] = m
	}
	if old := m[e.Seq]; old != nil {
		if old.MessageID != e.MessageID || old.Body != e.Body || old.Kind != e.Kind {
			d.t.Errorf("%s: %s/%d seen as %+v and as %+v", d.name, e.ConversationID, e.Seq, old, e)
		}
		return
	}
	m[e.Seq] = e
	if pushed && d.syncing == 0 {
		if at, err := time.Parse(protocol.TimeFormat, e.CreatedAt); err == nil {
			d.live = append(d.live, time.Since(at))
		}
	}
}

var errClosed = fmt.Errorf("connection closed")

// do sends a request and waits for its reply.
func (d *device) do(req map[string]any) (*frame, error) {
	c := d.current()
	if c == nil {
		return nil, errClosed
	}
	id := d.name + "-" + c.NewID()
	req["id"] = id
	b, _ := json.Marshal(req)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := c.Call(ctx, id, b)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: no reply to %s within 30 s", d.name, b)
		}
		return nil, errClosed
	}
	f := &frame{}
	if err := json.Unmarshal(a, f); err != nil {
		return nil, fmt.Errorf("%s: bad answer %s", d.name, a)
	}
	return f, nil
}

// doRetrying waits out rate_limited and unavailable as a client should.
func (d *device) doRetrying(req map[string]any) (*frame, error) {
	start := time.Now()
	for {
		f, err := d.do(req)
		if err != nil {
			return nil, err
		}
		if (f.Code != string(protocol.CodeUnavailable) && f.Code != string(protocol.CodeRateLimited)) || time.Since(start) > 60*time.Second {
			return f, nil
		}
		time.Sleep(time.Duration(max(f.RetryAfterMS, 10)) * time.Millisecond)
	}
}

// syncAll syncs from the device's cursors until the reply is complete.
func (d *device) syncAll() error {
	d.mu.Lock()
	d.syncing++
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.syncing--
		d.mu.Unlock()
	}()
	for {
		d.mu.Lock()
		cur := map[string]int64{}
		for k, v := range d.cursors {
			cur[k] = v
		}
		d.mu.Unlock()
		f, err := d.doRetrying(map[string]any{"op": "sync", "cursors": cur})
		if err != nil {
			return err
		}
		if f.Op != protocol.OpSynced {
			return fmt.Errorf("%s: sync answered %+v", d.name, f)
		}
		d.mu.Lock()
		for k, v := range f.Cursors {
			if v > d.cursors[k] {
				d.cursors[k] = v
			}
		}
		d.mu.Unlock()
		if !f.More {
			return nil
		}
	}
}

// history pages backwards through a conversation and adds what it reads to
// the view; it returns the seqs read, ascending.
func (d *device) history(conv string, pageSize int) ([]int64, error) {
	var seqs []int64
	before := int64(0)
	for {
		req := map[string]any{"op": "history", "conversation_id": conv, "limit": pageSize}
		if before > 0 {
			req["before_seq"] = before
		}
		f, err := d.doRetrying(req)
		if err != nil {
			return nil, err
		}
		if f.Op != protocol.OpHistory {
			return nil, fmt.Errorf("%s: history of %s answered %s %s", d.name, conv, f.Code, f.Message)
		}
		for i, e := range f.Events {
			if i > 0 && e.Seq <= f.Events[i-1].Seq {
				return nil, fmt.Errorf("%s: history page of %s not ascending", d.name, conv)
			}
			if before > 0 && e.Seq >= before {
				return nil, fmt.Errorf("%s: history of %s before %d returned %d", d.name, conv, before, e.Seq)
			}
			d.record(e, false)
			seqs = append(seqs, e.Seq)
		}
		if len(f.Events) < pageSize {
			sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
			return seqs, nil
		}
		before = f.Events[0].Seq
	}
}

// get returns the event the device holds at conv/seq.
func (d *device) get(conv string, seq int64) *protocol.Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.view[conv][seq]
}

// convs lists the conversations the device holds events of.
func (d *device) convs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for c := range d.view {
		out = append(out, c)
	}
	return out
}

// seqs returns the seqs the device holds of conv, ascending.
func (d *device) seqs(conv string) []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []int64
	for s := range d.view[conv] {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// periods is the log's membership periods (readmodel.LogPeriods) of the
// conversations of rows, by conversation and user: [from, to] inclusive,
// to = 1<<62 while open (as projectedPeriods has them).
func periods(rows []row) map[string]map[string][][2]int64 {
	evs := make([]*logrecord.Event, len(rows))
	for i, r := range rows {
		evs[i] = &logrecord.Event{ConversationID: r.Conv, Seq: r.Seq, Kind: r.Kind, Sender: r.Sender, UserID: r.UserID, Members: r.Members}
	}
	out := map[string]map[string][][2]int64{}
	for conv, users := range readmodel.LogPeriods(evs) {
		m := map[string][][2]int64{}
		for u, ps := range users {
			for _, p := range ps {
				to := p.To
				if to == math.MaxInt64 {
					to = 1 << 62
				}
				m[u] = append(m[u], [2]int64{p.From, to})
			}
		}
		out[conv] = m
	}
	return out
}

// visibleTo lists the seqs of conv's rows inside any of ps.
func visibleTo(rows []row, ps [][2]int64) map[int64]row {
	out := map[int64]row{}
	for _, r := range rows {
		for _, p := range ps {
			if r.Seq >= p[0] && r.Seq <= p[1] {
				out[r.Seq] = r
			}
		}
	}
	return out
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// events returns every event the device holds, for the world check.
func (d *device) events() []worldcheck.Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []worldcheck.Event
	for _, m := range d.view {
		for _, e := range m {
			out = append(out, worldEvent(e))
		}
	}
	return out
}

// worldEvent is a delivered event in the world checker's terms.
func worldEvent(e *protocol.Event) worldcheck.Event {
	return worldcheck.Event{Event: logrecord.Event{ConversationID: e.ConversationID, Seq: e.Seq, Kind: e.Kind, MessageID: e.MessageID,
		ClientMessageID: e.ClientMessageID, Sender: e.Sender, Body: e.Body, UserID: e.UserID, Members: e.Members}}
}
