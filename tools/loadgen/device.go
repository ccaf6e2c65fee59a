package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/client"
	"github.com/chatpipe/chatpipe/internal/jitter"
)

// op is one command of the run, with everything needed to retry it with
// the same ids.
type op struct {
	kind    string // create, send, join, kick, leave, sync
	conv    string
	cmid    string
	body    string
	target  string // join, kick: the user
	members []string
	cursors map[string]int64

	due  time.Time // send: when the schedule wanted it sent
	sent time.Time // first attempt written
	// sentAttempt is when the latest attempt was written.
	sentAttempt time.Time
	attempts    int
	// reqID is the request id of the latest attempt (its key in pending
	// until answered or superseded); waiting: a re-send is scheduled (a
	// late final answer to the latest attempt still counts and cancels
	// it); finished: answered or given up, a scheduled re-send is skipped.
	// All three are guarded by the device's mu.
	// gaveUp: a re-send was refused (budget or attempts); only a late
	// answer to the latest attempt can still end it.
	reqID                     string
	waiting, finished, gaveUp bool
	dup                       bool // the deliberate second copy of a send
	probe                     bool // a send by a user just removed (forbidden expected)

	// done, if set, is called once with the final answer.
	done func(f *frame)
}

// frame is any server frame the run reads.
type frame struct {
	Op              string           `json:"op"`
	ID              string           `json:"id"`
	ConversationID  string           `json:"conversation_id"`
	Seq             int64            `json:"seq"`
	MessageID       string           `json:"message_id"`
	ClientMessageID string           `json:"client_message_id"`
	Code            string           `json:"code"`
	Message         string           `json:"message"`
	RetryAfterMS    int64            `json:"retry_after_ms"`
	Kind            string           `json:"kind"`
	Sender          string           `json:"sender"`
	Body            string           `json:"body"`
	UserID          string           `json:"user_id"`
	Cursors         map[string]int64 `json:"cursors"`
	More            bool             `json:"more"`
}

// device is one websocket connection of a user. One goroutine (run) owns
// the connection's writes and reconnects; a reader goroutine per
// connection dispatches answers and events.
type device struct {
	r    *runner
	user string
	name string
	out  chan *op
	drop chan struct{} // close the connection and dial again (reconnect churn)
	// handle is d.frame as a func value, made once: it takes every server
	// frame, answers (routed by request id) and events alike.
	handle func([]byte)

	mu        sync.Mutex
	pending   map[string]*op
	next      int
	cursors   map[string]*convCursor // per conversation: what a sync starts from
	connected chan struct{}          // closed on the first successful dial
	once      sync.Once
}

func newDevice(r *runner, user string, i int) *device {
	d := &device{r: r, user: user, name: DeviceName(user, i), out: make(chan *op, 4096), drop: make(chan struct{}, 1),
		pending: map[string]*op{}, cursors: map[string]*convCursor{}, connected: make(chan struct{})}
	d.handle = d.frame
	return d
}

var (
	errConnLost = errors.New("loadgen: connection lost")
	errDropped  = errors.New("loadgen: connection closed to reconnect")
)

// run keeps the device connected until ctx ends, reconnecting with
// jittered exponential backoff; commands in flight on a lost connection
// are sent again with the same ids.
func (d *device) run(ctx context.Context) {
	for attempt := 0; ctx.Err() == nil; {
		conn, err := d.dial(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.r.errors.Add(1)
			d.r.log.Debug("dial failed", "device", d.name, "err", err)
			jitter.Sleep(ctx, backoff(attempt))
			attempt++
			continue
		}
		first := false
		d.once.Do(func() { first = true; close(d.connected) })
		if !first {
			d.r.reconnects.Add(1)
			if d.r.deliveryServed() {
				d.r.track(1)
				// Not d.enqueue: this goroutine is the queue's only reader
				// until writeLoop starts, so a full queue would block forever.
				d.r.retryAfter(ctx, d, &op{kind: "sync", cursors: d.cursorCopy(), done: d.r.syncDone(ctx, d)}, 0)
			}
		}
		attempt = 0
		err = d.writeLoop(ctx, conn)
		conn.CloseNow() // and its reader has stopped
		if ctx.Err() != nil {
			return
		}
		if !errors.Is(err, errDropped) {
			d.r.errors.Add(1)
		}
		d.r.log.Debug("connection lost", "device", d.name, "err", err, "read", conn.Err())
		d.mu.Lock()
		var again, lost []*op
		for id, o := range d.pending {
			delete(d.pending, id)
			switch {
			case o.gaveUp && !o.finished: // its late answer cannot come now
				o.finished = true
				lost = append(lost, o)
			case !o.waiting: // else its re-send is already scheduled
				o.waiting = true
				again = append(again, o)
			}
		}
		d.mu.Unlock()
		for _, o := range lost {
			d.r.abandon(d, o)
		}
		for _, o := range again {
			d.r.resend(ctx, d, o, "connection", 0)
		}
		jitter.Sleep(ctx, backoff(0))
	}
}

// backoff is full jitter: random(0, min(5 s, 100 ms × 2^attempt)).
func backoff(attempt int) time.Duration {
	return jitter.Backoff(attempt, 100*time.Millisecond, 5*time.Second)
}

// dial opens a connection of the device on the client package's
// multiplexer: answers are routed by request id to frame, and so is
// everything else (events), in the order received.
func (d *device) dial(ctx context.Context) (*client.Conn, error) {
	tok, err := d.r.token(d.user)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := client.DialConn(dctx, d.r.cfg.Stack.WebSocket, client.ConnOptions{Token: tok, Batch: !d.r.cfg.PlainFrames,
		ReadLimit: 1 << 20, OnFrame: d.handle})
	if err != nil {
		return nil, fmt.Errorf("loadgen: dial as %s: %w", d.user, err)
	}
	return conn, nil
}

// frame handles one server frame, as it arrives.
func (d *device) frame(b []byte) { d.dispatch(b, time.Now()) }

// enqueue hands o to the device's writer; it blocks while the queue is
// full (the run is then saturated: the schedule's due times keep counting).
func (d *device) enqueue(ctx context.Context, o *op) {
	select {
	case d.out <- o:
	case <-ctx.Done():
		d.r.track(-1)
	}
}

func (d *device) writeLoop(ctx context.Context, conn *client.Conn) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			conn.Close(websocket.StatusNormalClosure, "run over")
			return ctx.Err()
		case <-conn.Done():
			return errConnLost
		case <-d.drop:
			conn.Close(websocket.StatusNormalClosure, "reconnect")
			return errDropped
		case now := <-tick.C:
			d.sweep(ctx, now)
		case o := <-d.out:
			if err := d.write(ctx, conn, o); err != nil {
				d.r.resend(ctx, d, o, "connection", 0)
				return err
			}
		}
	}
}

// sweep schedules a re-send, with the same ids, of every command
// unanswered for longer than the answer timeout (or gives it up). The
// late attempt stays pending: its answer, if it comes before the re-send,
// is the command's answer.
func (d *device) sweep(ctx context.Context, now time.Time) {
	var late []*op
	d.mu.Lock()
	for _, o := range d.pending {
		if !o.waiting && now.Sub(o.sentAttempt) > d.r.cfg.Timeout {
			o.waiting = true
			late = append(late, o)
		}
	}
	d.mu.Unlock()
	for _, o := range late {
		d.r.errors.Add(1)
		d.r.resend(ctx, d, o, "timeout", 0)
	}
}

func (d *device) write(ctx context.Context, conn *client.Conn, o *op) error {
	d.mu.Lock()
	if o.finished { // answered late, or given up, while its re-send waited
		d.mu.Unlock()
		return nil
	}
	if o.reqID != "" {
		delete(d.pending, o.reqID) // superseded: its answer no longer counts
		conn.Forget(o.reqID)
	}
	o.waiting = false
	d.next++
	id := "r" + strconv.Itoa(d.next)
	now := time.Now()
	o.attempts++
	o.sentAttempt = now
	if o.sent.IsZero() {
		o.sent = now
		d.r.commands.Add(1)
		d.r.rs.first()
		if o.kind == "send" && !o.dup && !o.probe {
			d.r.sent.Add(1)
		}
	} else {
		d.r.resends.Add(1)
	}
	d.pending[id] = o
	o.reqID = id
	d.mu.Unlock()
	b := d.encode(o, id)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := conn.Go(wctx, id, b, d.handle); err != nil {
		d.mu.Lock()
		delete(d.pending, id)
		d.mu.Unlock()
		return fmt.Errorf("loadgen: write: %w", err)
	}
	return nil
}

// encode makes the request frame of o's attempt id.
func (d *device) encode(o *op, id string) []byte {
	return appendRequest(make([]byte, 0, 64+len(o.body)), o, id)
}

// dispatch handles one server frame received at now.
func (d *device) dispatch(b []byte, now time.Time) {
	var f frame
	if err := decodeFrame(b, &f); err != nil {
		d.r.errors.Add(1)
		return
	}
	switch f.Op {
	case "event":
		d.mu.Lock()
		d.cursor(f.ConversationID).event(d.user, f.Seq, f.Kind, f.UserID)
		d.mu.Unlock()
		d.r.delivered(d, &f, now)
	case "accepted", "rejected", "synced":
		d.mu.Lock()
		if f.Op == "synced" {
			// Its events came before it: it covers its cursors, gaps
			// included.
			for c, seq := range f.Cursors {
				d.cursor(c).covered(d.user, seq)
			}
		}
		o := d.pending[f.ID]
		delete(d.pending, f.ID)
		var lost *op
		if o != nil && o.waiting {
			switch {
			case retryable(&f) && o.gaveUp: // no re-send allowed: unknown
				o.finished, lost, o = true, o, nil
			case retryable(&f):
				o = nil // its re-send is already scheduled
			default:
				o.finished = true // a late final answer: skip the re-send
			}
		}
		d.mu.Unlock()
		if lost != nil {
			d.r.abandon(d, lost)
		}
		if o != nil { // nil: an answer to an attempt already superseded
			d.r.answer(d, o, &f, now)
		}
	}
}

// retryable reports whether f asks for the command to be sent again.
func retryable(f *frame) bool {
	return f.Op == "rejected" && (f.Code == "unavailable" || f.Code == "rate_limited")
}

// cursor is conv's cursor (the caller holds mu).
func (d *device) cursor(conv string) *convCursor {
	c := d.cursors[conv]
	if c == nil {
		c = &convCursor{}
		d.cursors[conv] = c
	}
	return c
}

// cursorCopy is what a sync starts from: per conversation, the seq up to
// which the device holds every event it may see (not the highest seq it
// was pushed: a gap before it would never be filled).
func (d *device) cursorCopy() map[string]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := make(map[string]int64, len(d.cursors))
	for k, c := range d.cursors {
		if c.seq > 0 {
			m[k] = c.seq
		}
	}
	return m
}

// messageBody makes a body of about n bytes that carries the message's
// ids and due time, so a device can measure delivery latency from it.
func messageBody(cmid string, due time.Time, n int) string {
	s := cmid + " " + strconv.FormatInt(due.UnixNano(), 10) + " "
	if len(s) < n {
		s += strings.Repeat("x", n-len(s))
	}
	return s
}

// bodyDue reads the due time back from a body made by messageBody.
func bodyDue(body string) (time.Time, bool) {
	_, rest, ok := strings.Cut(body, " ")
	if !ok {
		return time.Time{}, false
	}
	ns, _, _ := strings.Cut(rest, " ")
	v, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, v), true
}
