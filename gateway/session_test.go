package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/internal/delivery"
	"github.com/chatpipe/chatpipe/protocol"
)

// serveGateway serves g over HTTP for the test.
func serveGateway(t testing.TB, g *Gateway) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// wsClient is a device of a user connected to a test gateway.
type wsClient struct {
	t testing.TB
	c *websocket.Conn
}

func dialWS(t testing.TB, srv *httptest.Server, user string, subprotocols ...string) *wsClient {
	t.Helper()
	tok, err := auth.Mint([]byte("secret"), user, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/ws?token="+tok,
		&websocket.DialOptions{Subprotocols: subprotocols})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return &wsClient{t: t, c: c}
}

func (w *wsClient) write(frame string) {
	w.t.Helper()
	if err := w.c.Write(context.Background(), websocket.MessageText, []byte(frame)); err != nil {
		w.t.Fatal(err)
	}
}

// readRaw reads one message (within d).
func (w *wsClient) readRaw(d time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, b, err := w.c.Read(ctx)
	return string(b), err
}

// serverFrame holds any server frame's fields.
type serverFrame struct {
	Op             string                       `json:"op"`
	ID             string                       `json:"id"`
	ConversationID string                       `json:"conversation_id"`
	Seq            int64                        `json:"seq"`
	Code           string                       `json:"code"`
	Message        string                       `json:"message"`
	RetryAfterMS   int64                        `json:"retry_after_ms"`
	Cursors        map[string]int64             `json:"cursors"`
	More           bool                         `json:"more"`
	Events         []*protocol.Event            `json:"events"`
	Conversations  []*protocol.ConversationInfo `json:"conversations"`
}

func (w *wsClient) read() serverFrame {
	w.t.Helper()
	s, err := w.readRaw(5 * time.Second)
	if err != nil {
		w.t.Fatalf("read: %v", err)
	}
	var f serverFrame
	if err := json.Unmarshal([]byte(s), &f); err != nil {
		w.t.Fatalf("frame %q: %v", s, err)
	}
	return f
}

// readFrame reads and decodes one frame (within d).
func (w *wsClient) readFrame(d time.Duration) (serverFrame, error) {
	var f serverFrame
	s, err := w.readRaw(d)
	if err != nil {
		return f, err
	}
	return f, json.Unmarshal([]byte(s), &f)
}

// onlySession returns user's one session here.
func onlySession(g *Gateway, user string) *session {
	var out *session
	g.users.each(user, func(s *session) { out = s })
	return out
}

// devices counts the sessions of user attached for delivery.
func devices(g *Gateway, user string) int {
	g.users.mu.Lock()
	defer g.users.mu.Unlock()
	if st := g.users.m[user]; st != nil {
		return len(st.devices)
	}
	return 0
}

// readGateway is a gateway with one worker (w1, accepting at seq 5) and the
// read model reads.
func readGateway(t testing.TB, reads ReadModel, edit func(*Config)) (*Gateway, *httptest.Server) {
	t.Helper()
	owners, n := newFakeOwners(), newFakeNet()
	owners.set(0, "w1", 1)
	n.worker("w1", acceptAs("w1", 5))
	g := fakeGateway(t, owners, n, func(c *Config) {
		if reads != nil {
			c.Reads = reads
		}
		if edit != nil {
			edit(c)
		}
	})
	return g, serveGateway(t, g)
}

// sync answers the read model's events, then synced with its cursors; the
// read model is asked for the token's user, the client's cursors and at
// most SyncMax events.
func TestSyncIsServedFromTheReadModel(t *testing.T) {
	reads := &fakeReads{syncRes: &delivery.SyncResult{
		Events: []*protocol.Event{
			{Op: protocol.OpEvent, ConversationID: "c1", Seq: 3, Kind: "message", Sender: "u2", Body: "a"},
			{Op: protocol.OpEvent, ConversationID: "c1", Seq: 4, Kind: "message", Sender: "u2", Body: "b"},
		},
		Cursors: map[string]int64{"c1": 4, "c2": 7}, More: true}}
	_, srv := readGateway(t, reads, func(c *Config) { c.SyncMax = 2 })
	w := dialWS(t, srv, "u1")
	w.write(`{"op":"sync","id":"s1","cursors":{"c1":2}}`)
	for _, seq := range []int64{3, 4} {
		if f := w.read(); f.Op != protocol.OpEvent || f.ConversationID != "c1" || f.Seq != seq {
			t.Fatalf("frame %+v, want event c1/%d", f, seq)
		}
	}
	f := w.read()
	if f.Op != protocol.OpSynced || f.ID != "s1" || !f.More || !reflect.DeepEqual(f.Cursors, map[string]int64{"c1": 4, "c2": 7}) {
		t.Fatalf("frame %+v, want synced s1 with the read model's cursors and more", f)
	}
	reads.mu.Lock()
	defer reads.mu.Unlock()
	if want := []any{"u1", map[string]int64{"c1": 2}, 2}; !reflect.DeepEqual(reads.syncArgs, want) {
		t.Fatalf("Sync(%v), want %v", reads.syncArgs, want)
	}
}

// history answers a page from the read model, clamped to MaxHistory;
// a user who never was a member is answered forbidden, and a read model
// that fails, unavailable.
func TestHistoryIsServedFromTheReadModel(t *testing.T) {
	reads := &fakeReads{history: []*protocol.Event{{ConversationID: "c1", Seq: 1, Kind: "created", Sender: "u1"}}}
	_, srv := readGateway(t, reads, nil)
	w := dialWS(t, srv, "u1")

	w.write(`{"op":"history","id":"h1","conversation_id":"c1","before_seq":9}`)
	f := w.read()
	if f.Op != protocol.OpHistory || f.ID != "h1" || f.ConversationID != "c1" || len(f.Events) != 1 || f.Events[0].Kind != "created" {
		t.Fatalf("frame %+v, want the read model's page", f)
	}
	if args, _ := reads.lastHistory(); !reflect.DeepEqual(args, []any{"u1", "c1", int64(9), 50}) {
		t.Fatalf("History(%v), want (u1, c1, 9, 50): the default page", args)
	}
	w.write(`{"op":"history","id":"h2","conversation_id":"c1","limit":100000}`)
	w.read()
	if args, _ := reads.lastHistory(); args[3] != protocol.DefaultLimits().MaxHistory {
		t.Fatalf("limit 100000 asked as %v, want MaxHistory", args[3])
	}

	reads.mu.Lock()
	reads.histErr = delivery.ErrForbidden
	reads.mu.Unlock()
	w.write(`{"op":"history","id":"h3","conversation_id":"c2"}`)
	if f := w.read(); f.Op != protocol.OpRejected || f.ID != "h3" || f.Code != string(protocol.CodeForbidden) {
		t.Fatalf("frame %+v, want forbidden", f)
	}
	reads.mu.Lock()
	reads.histErr = errors.New("connection reset")
	reads.mu.Unlock()
	w.write(`{"op":"history","id":"h4","conversation_id":"c2"}`)
	if f := w.read(); f.ID != "h4" || f.Code != string(protocol.CodeUnavailable) || f.RetryAfterMS != 500 {
		t.Fatalf("frame %+v, want unavailable with retry_after_ms 500", f)
	}
}

// Without a read model, sync, history and conversations are answered
// unavailable.
func TestReadsWithoutAReadModelAreUnavailable(t *testing.T) {
	_, srv := readGateway(t, nil, nil)
	w := dialWS(t, srv, "u1")
	for _, frame := range []string{
		`{"op":"sync","id":"r1"}`,
		`{"op":"history","id":"r2","conversation_id":"c1"}`,
		`{"op":"conversations","id":"r3"}`,
	} {
		w.write(frame)
		if f := w.read(); f.Op != protocol.OpRejected || f.Code != string(protocol.CodeUnavailable) || f.RetryAfterMS != 1000 {
			t.Fatalf("%s: frame %+v, want unavailable with retry_after_ms 1000", frame, f)
		}
	}
}

// After a session's send is accepted at seq 5, its history waits until the
// read model covers seq 5; another session of the same user does not wait.
func TestReadWaitsForTheSessionsOwnWrite(t *testing.T) {
	reads := &fakeReads{}
	reads.cover("c1", 4)
	_, srv := readGateway(t, reads, func(c *Config) { c.ReadYourWrites = 5 * time.Second })
	w := dialWS(t, srv, "u1")
	other := dialWS(t, srv, "u1")

	w.write(`{"op":"send","id":"r1","conversation_id":"c1","client_message_id":"m1","body":"hi"}`)
	if f := w.read(); f.Op != protocol.OpAccepted || f.Seq != 5 {
		t.Fatalf("frame %+v, want accepted at 5", f)
	}
	other.write(`{"op":"history","id":"h0","conversation_id":"c1"}`)
	other.read()
	if _, cover := reads.lastHistory(); cover != 4 {
		t.Fatalf("the other session's history ran with the read model at %d, want 4 (no wait)", cover)
	}

	time.AfterFunc(200*time.Millisecond, func() { reads.cover("c1", 5) })
	w.write(`{"op":"history","id":"h1","conversation_id":"c1"}`)
	if f := w.read(); f.Op != protocol.OpHistory || f.ID != "h1" {
		t.Fatalf("frame %+v, want the history page", f)
	}
	if _, cover := reads.lastHistory(); cover != 5 {
		t.Fatalf("history ran with the read model at %d, before it covered the session's write at 5", cover)
	}
}

// A read model that does not cover the session's write within
// ReadYourWrites has the read answered unavailable, without reading.
func TestReadYourWritesTimesOut(t *testing.T) {
	reads := &fakeReads{}
	reads.cover("c1", 4)
	g, srv := readGateway(t, reads, func(c *Config) { c.ReadYourWrites = 150 * time.Millisecond })
	w := dialWS(t, srv, "u1")
	w.write(`{"op":"send","id":"r1","conversation_id":"c1","client_message_id":"m1","body":"hi"}`)
	w.read()
	start := time.Now()
	w.write(`{"op":"history","id":"h1","conversation_id":"c1"}`)
	f := w.read()
	if f.Code != string(protocol.CodeUnavailable) || f.RetryAfterMS != 200 || !strings.Contains(f.Message, "seq 5 in c1") {
		t.Fatalf("frame %+v, want unavailable naming the write at seq 5 in c1", f)
	}
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Fatalf("answered after %v, before ReadYourWrites (150ms)", took)
	}
	if args, _ := reads.lastHistory(); args != nil {
		t.Fatalf("History was called (%v) though the read model lacked the write", args)
	}
	if n := g.rywTimeouts.Load(); n != 1 {
		t.Fatalf("read-your-writes timeouts %d, want 1", n)
	}
}

// conversations answers the read model's list.
func TestConversationsIsServedFromTheReadModel(t *testing.T) {
	reads := &fakeReads{convs: []*protocol.ConversationInfo{{ConversationID: "c2", LastSeq: 8}, {ConversationID: "c1", LastSeq: 3}}}
	_, srv := readGateway(t, reads, nil)
	w := dialWS(t, srv, "u1")
	w.write(`{"op":"conversations","id":"l1"}`)
	f := w.read()
	if f.Op != protocol.OpConversations || f.ID != "l1" || len(f.Conversations) != 2 || f.Conversations[0].ConversationID != "c2" {
		t.Fatalf("frame %+v, want the read model's list in order", f)
	}
}

// An upgrade without a valid token is refused with 401.
func TestUpgradeWithoutAValidTokenIsRefused(t *testing.T) {
	g, srv := readGateway(t, nil, nil)
	for _, q := range []string{"", "?token=garbage"} {
		resp, err := http.Get(srv.URL + "/v1/ws" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("upgrade%s: status %d, want 401", q, resp.StatusCode)
		}
	}
	if n := g.Stats().Unauthorized.Load(); n != 2 {
		t.Fatalf("unauthorized counter %d, want 2", n)
	}
}

// A user past MaxConnsPerUser is refused with 429.
func TestConnectionsPerUserAreCapped(t *testing.T) {
	_, srv := readGateway(t, nil, func(c *Config) { c.MaxConnsPerUser = 1 })
	dialWS(t, srv, "u1")
	tok, _ := auth.Mint([]byte("secret"), "u1", time.Hour, time.Now())
	resp, err := http.Get(srv.URL + "/v1/ws?token=" + tok)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second connection: status %d, want 429", resp.StatusCode)
	}
}

// Bad frames are answered bad_request (echoing the id when there is one)
// and the connection goes on.
func TestBadFramesAreRejected(t *testing.T) {
	g, srv := readGateway(t, nil, nil)
	w := dialWS(t, srv, "u1")
	if err := w.c.Write(context.Background(), websocket.MessageBinary, []byte(`{"op":"sync","id":"b1"}`)); err != nil {
		t.Fatal(err)
	}
	if f := w.read(); f.Code != string(protocol.CodeBadRequest) || !strings.Contains(f.Message, "text") {
		t.Fatalf("binary frame: %+v, want bad_request", f)
	}
	w.write(`{"op":"fly","id":"b2"}`)
	if f := w.read(); f.Code != string(protocol.CodeBadRequest) || f.ID != "b2" {
		t.Fatalf("unknown op: %+v, want bad_request for b2", f)
	}
	w.write(`{"op":"send","id":"b3","conversation_id":"c1","client_message_id":"m1"}`)
	if f := w.read(); f.Code != string(protocol.CodeBadRequest) || f.ID != "b3" {
		t.Fatalf("send without a body: %+v, want bad_request for b3", f)
	}
	w.write(`{"op":"send","id":"ok","conversation_id":"c1","client_message_id":"m1","body":"hi"}`)
	if f := w.read(); f.Op != protocol.OpAccepted || f.ID != "ok" {
		t.Fatalf("a good frame after the bad ones: %+v", f)
	}
	if n := g.Stats().Rejected.Load(); n != 3 {
		t.Fatalf("rejected counter %d, want 3", n)
	}
}

// Commands past the user's bucket are answered rate_limited with
// retry_after_ms, before any worker sees them.
func TestCommandsAreRateLimited(t *testing.T) {
	_, srv := readGateway(t, nil, func(c *Config) { c.UserRate, c.UserBurst = 0.5, 1 })
	w := dialWS(t, srv, "u1")
	w.write(`{"op":"send","id":"r1","conversation_id":"c1","client_message_id":"m1","body":"hi"}`)
	if f := w.read(); f.Op != protocol.OpAccepted {
		t.Fatalf("first command: %+v", f)
	}
	w.write(`{"op":"send","id":"r2","conversation_id":"c1","client_message_id":"m2","body":"hi"}`)
	if f := w.read(); f.Code != string(protocol.CodeRateLimited) || f.ID != "r2" || f.RetryAfterMS <= 0 {
		t.Fatalf("second command: %+v, want rate_limited with retry_after_ms", f)
	}
}

// Deliver sends a user's frames to each of their devices here, in order:
// one message per frame, or newline-joined for a batching device; other
// users get nothing. It counts the devices it queued to, and the gateway
// counts the frames and websocket messages it wrote.
func TestDeliverReachesTheUsersDevices(t *testing.T) {
	g, srv := readGateway(t, nil, nil)
	plain := dialWS(t, srv, "u1")
	batch := dialWS(t, srv, "u1", protocol.SubprotocolBatch)
	bystander := dialWS(t, srv, "u2")
	if !waitFor(5*time.Second, func() bool { return devices(g, "u1") == 2 && devices(g, "u2") == 1 }) {
		t.Fatal("the devices were not attached")
	}
	if !g.Local("u1") || g.Local("u3") {
		t.Fatalf("Local(u1) = %v, Local(u3) = %v", g.Local("u1"), g.Local("u3"))
	}
	frames := [][]byte{[]byte(`{"op":"event","seq":1}`), []byte(`{"op":"event","seq":2}`), []byte(`{"op":"event","seq":3}`)}
	frames0, msgs0 := g.wsFrames.Load(), g.wsMessages.Load()
	if n := g.Deliver("u1", asPushes("c1", frames)); n != 2 {
		t.Fatalf("Deliver queued to %d devices, want 2", n)
	}
	if n := g.Deliver("u3", asPushes("c1", frames)); n != 0 {
		t.Fatalf("Deliver to a user with no device here queued to %d devices", n)
	}
	for i, f := range frames {
		if got, err := plain.readRaw(5 * time.Second); err != nil || got != string(f) {
			t.Fatalf("plain device, message %d: %q %v, want %s", i, got, err, f)
		}
	}
	if got, err := batch.readRaw(5 * time.Second); err != nil || got != string(joinFrames(frames)) {
		t.Fatalf("batching device: %q %v, want the three frames in one message", got, err)
	}
	// 3 frames in 3 messages to the plain device, 3 in 1 to the batching one.
	if !waitFor(5*time.Second, func() bool { return g.wsFrames.Load()-frames0 == 6 && g.wsMessages.Load()-msgs0 == 4 }) {
		t.Fatalf("counted %d frames in %d messages, want 6 in 4", g.wsFrames.Load()-frames0, g.wsMessages.Load()-msgs0)
	}
	if got, err := bystander.readRaw(200 * time.Millisecond); err == nil {
		t.Fatalf("u2 got %q, meant for u1", got)
	}
}

// asPushes makes frames pushes of conv at seqs 1, 2, ...
func asPushes(conv string, frames [][]byte) []delivery.Push {
	out := make([]delivery.Push, len(frames))
	for i, f := range frames {
		out[i] = delivery.Push{Conv: conv, Seq: int64(i + 1), Frame: f}
	}
	return out
}

// storedEvents makes n events of conv (seqs 1..n) and their pushes; pad
// lengthens each body.
func storedEvents(t *testing.T, conv string, n int, pad string) ([]*protocol.Event, []delivery.Push) {
	t.Helper()
	var events []*protocol.Event
	var pushes []delivery.Push
	for seq := int64(1); seq <= int64(n); seq++ {
		e := &protocol.Event{Op: protocol.OpEvent, ConversationID: conv, Seq: seq, Kind: "message", Sender: "u2", Body: fmt.Sprint("m", seq, pad)}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, e)
		pushes = append(pushes, delivery.Push{Conv: conv, Seq: seq, Frame: b})
	}
	return events, pushes
}

// A burst of pushes larger than a device's send buffer does not close a
// device that reads, even slowly: what did not fit is read back from the
// read model and arrives in seq order, each event once; afterwards pushes
// go straight to the buffer again. The device's socket buffers are small
// and it pauses as it reads, so the gateway's writer waits for it and the
// read-back waits for room. (Pushes that keep coming during a read-back:
// TestSlowReaderGetsEachConversationInSeqOrder.)
func TestBurstLargerThanTheSendBufferIsReadBack(t *testing.T) {
	const burst = 2000
	events, pushes := storedEvents(t, "c1", burst+5, strings.Repeat("x", 2048))
	reads := &fakeReads{stored: events[:burst]}
	g, _ := readGateway(t, reads, func(c *Config) { c.SendBuffer, c.SyncMax = 16, 100 })
	w := dialSmallSocket(t, serveSmallSockets(t, g), "u1")
	if !waitFor(5*time.Second, func() bool { return g.Local("u1") }) {
		t.Fatal("the device was not attached")
	}
	g.Deliver("u1", pushes[:burst])
	for want := int64(1); want <= burst; want++ {
		f, err := w.readFrame(10 * time.Second)
		if err != nil {
			t.Fatalf("after seq %d: %v", want-1, err)
		}
		if f.Op != protocol.OpEvent || f.Seq != want {
			t.Fatalf("got %s seq %d, want event %d", f.Op, f.Seq, want)
		}
		if want%4 == 0 {
			time.Sleep(time.Millisecond) // a slow reader
		}
	}
	if n := g.backlogged.Load(); n != 1 {
		t.Fatalf("backlogs %d, want 1", n)
	}
	if !waitFor(5*time.Second, func() bool { return !backlogActive(g, "u1") }) {
		t.Fatal("the session is still reading back")
	}
	reads.mu.Lock()
	calls := reads.sinceCalls
	reads.stored = events
	reads.mu.Unlock()
	g.Deliver("u1", pushes[burst:]) // within the 8 frames pushes may fill (16, less room for replies)
	for want := int64(burst + 1); want <= burst+5; want++ {
		if f, err := w.readFrame(10 * time.Second); err != nil || f.Seq != want {
			t.Fatalf("after the backlog: %+v %v, want seq %d", f, err, want)
		}
	}
	reads.mu.Lock()
	defer reads.mu.Unlock()
	if reads.sinceCalls != calls {
		t.Fatalf("pushes that fit were read back (%d reads, %d before)", reads.sinceCalls, calls)
	}
	if n := g.slowClosed.Load(); n != 0 {
		t.Fatalf("slow readers closed %d, want 0", n)
	}
}

// Pushes that arrive while a backlog is read back join it, and the read
// markers that did not fit arrive as the highest of them — not as the read
// model's newer marker, which the feed's older pushes would then follow.
func TestPushesDuringABacklogJoinIt(t *testing.T) {
	events, pushes := storedEvents(t, "c1", 60, "")
	reads := &fakeReads{stored: events, marks: map[string]int64{"c1": 9}, gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	g, srv := readGateway(t, reads, func(c *Config) { c.SendBuffer = 4 })
	w := dialWS(t, srv, "u1")
	if !waitFor(5*time.Second, func() bool { return g.Local("u1") }) {
		t.Fatal("the device was not attached")
	}
	s := onlySession(g, "u1")
	s.backlog.mu.Lock()
	s.backlog.active = true
	s.backlog.add(pushes[0])
	s.backlog.wake <- struct{}{}
	s.backlog.mu.Unlock()
	// The catch-up has taken the backlog as it was (one event, no marker)
	// and waits in its read while more is pushed.
	select {
	case <-reads.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the catch-up did not start reading back")
	}
	marker := func(seq int64) delivery.Push {
		return delivery.Push{Conv: "c1", Seq: seq, Read: true, Frame: []byte(fmt.Sprintf(`{"op":"read","conversation_id":"c1","seq":%d}`, seq))}
	}
	g.Deliver("u1", append(pushes[1:40], marker(5)))
	g.Deliver("u1", append(pushes[40:], marker(7)))
	close(reads.gate)
	var seqs []int64
	var markers []int64
	for len(seqs) < 60 || len(markers) == 0 {
		f, err := w.readFrame(5 * time.Second)
		if err != nil {
			t.Fatalf("after %d events (markers %v): %v", len(seqs), markers, err)
		}
		if f.Op == protocol.OpRead {
			if f.ConversationID != "c1" || f.Seq != 7 {
				t.Fatalf("marker %+v, want c1 at 7 (the highest pushed)", f)
			}
			markers = append(markers, f.Seq)
			continue
		}
		if f.Seq != int64(len(seqs)+1) {
			t.Fatalf("event %d after %v", f.Seq, seqs)
		}
		seqs = append(seqs, f.Seq)
	}
	if f, err := w.readFrame(200 * time.Millisecond); err == nil {
		t.Fatalf("after the events and the marker: %+v", f)
	}
}

// A device that does not read while its send buffer fills is closed with
// 1008 once a frame has waited SlowReader for room.
func TestSlowReaderIsClosed(t *testing.T) {
	events, pushes := storedEvents(t, "c1", 10000, strings.Repeat("x", 4000)) // 40 MB: more than the socket buffers hold
	g, srv := readGateway(t, &fakeReads{stored: events}, func(c *Config) { c.SendBuffer, c.SlowReader = 1, 200*time.Millisecond })
	w := dialWS(t, srv, "u1")
	if !waitFor(5*time.Second, func() bool { return g.Local("u1") }) {
		t.Fatal("the device was not attached")
	}
	g.Deliver("u1", pushes)
	time.Sleep(time.Second) // not reading
	var err error
	for err == nil {
		_, err = w.readRaw(5 * time.Second)
	}
	if s := websocket.CloseStatus(err); s != websocket.StatusPolicyViolation {
		t.Fatalf("connection ended with %v (status %d), want 1008", err, s)
	}
	if n := g.slowClosed.Load(); n != 1 {
		t.Fatalf("slow readers closed %d, want 1", n)
	}
}

// Lost closes every connection with 1013 (reconnect and sync); Shutdown
// with 1012.
func TestLostAndShutdownCloseConnections(t *testing.T) {
	g, srv := readGateway(t, nil, nil)
	w := dialWS(t, srv, "u1")
	if !waitFor(5*time.Second, func() bool { return g.Stats().Connections.Load() == 1 }) {
		t.Fatal("the connection was not registered")
	}
	g.Lost("outbox trimmed")
	if _, err := w.readRaw(5 * time.Second); websocket.CloseStatus(err) != websocket.StatusTryAgainLater {
		t.Fatalf("after Lost: %v, want 1013", err)
	}
	// (the first connection counts until its close handshake ends: wait for
	// it to go, so that the count of 1 below is the new connection's)
	if !waitFor(5*time.Second, func() bool { return g.Stats().Connections.Load() == 0 }) {
		t.Fatal("the closed connection was not unregistered")
	}
	w = dialWS(t, srv, "u1")
	if !waitFor(5*time.Second, func() bool { return g.Stats().Connections.Load() == 1 }) {
		t.Fatal("the new connection was not registered")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go g.Shutdown(ctx)
	if _, err := w.readRaw(5 * time.Second); websocket.CloseStatus(err) != websocket.StatusServiceRestart {
		t.Fatalf("after Shutdown: %v, want 1012", err)
	}
}
