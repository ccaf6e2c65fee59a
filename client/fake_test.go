package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/protocol"
)

// fakeServer speaks enough of the protocol for the client's logic: one
// user, conversations with seqs, dedupe by client_message_id, sync with
// paging, history, pushes. Hooks let a test lose answers and connections.
type fakeServer struct {
	t  *testing.T
	ts *httptest.Server

	// syncPage caps the events of one sync reply (more: true after).
	syncPage int
	// dupPush sends every pushed event twice.
	dupPush bool
	// hook, when set, is asked about every request before it is handled.
	// It returns what to do: "" handle normally, "drop" handle it but close
	// the connection instead of answering, "ignore" neither handle nor
	// answer, or a frame to answer with instead.
	hook func(conn int, req *protocol.Request) string
	// tokens, when set, plays the gateway's token rules instead of the
	// fixed "tok-u1": a token whose exp (read without verifying) is past
	// is refused at the upgrade, commands on a connection whose token
	// expired answer unauthorized, and refresh replaces the connection's
	// token.
	tokens bool

	mu      sync.Mutex
	connTok map[int]string // with tokens: each connection's current token
	conns   []*websocket.Conn
	reqs    []seenReq
	convs   map[string][]*protocol.Event
	done    map[string]*protocol.Reply // conv/cmid → first reply
	nmsg    int
}

type seenReq struct {
	conn int
	req  protocol.Request
	at   time.Time
}

func newFake(t *testing.T) *fakeServer {
	f := &fakeServer{t: t, syncPage: 1000, convs: map[string][]*protocol.Event{}, done: map[string]*protocol.Reply{}}
	f.ts = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(func() {
		f.mu.Lock()
		for _, c := range f.conns {
			c.CloseNow()
		}
		f.mu.Unlock()
		f.ts.Close()
	})
	return f
}

func (f *fakeServer) url() string { return "ws" + strings.TrimPrefix(f.ts.URL, "http") + "/v1/ws" }

func (f *fakeServer) serve(w http.ResponseWriter, r *http.Request) {
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if f.tokens {
		if exp, ok := tokenExpiry(tok); !ok || time.Now().After(exp) {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
	} else if tok != "tok-u1" {
		http.Error(w, "no", http.StatusUnauthorized)
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{protocol.SubprotocolBatch}})
	if err != nil {
		return
	}
	batch := c.Subprotocol() == protocol.SubprotocolBatch
	f.mu.Lock()
	n := len(f.conns)
	f.conns = append(f.conns, c)
	if f.connTok == nil {
		f.connTok = map[int]string{}
	}
	f.connTok[n] = tok
	f.mu.Unlock()
	ctx := r.Context()
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		var req protocol.Request
		if err := json.Unmarshal(b, &req); err != nil {
			f.t.Errorf("bad frame from client: %s", b)
			return
		}
		f.mu.Lock()
		f.reqs = append(f.reqs, seenReq{conn: n, req: req, at: time.Now()})
		hook := f.hook
		f.mu.Unlock()
		action := ""
		if hook != nil {
			action = hook(n, &req)
		}
		if action == "" && f.tokens {
			action = f.checkToken(n, &req)
		}
		switch {
		case action == "ignore":
			continue
		case strings.HasPrefix(action, "{"):
			c.Write(ctx, websocket.MessageText, []byte(action))
			continue
		}
		out, push := f.handle(&req)
		if action == "drop" {
			c.CloseNow()
			return
		}
		for _, p := range push {
			f.pushAll(ctx, p)
		}
		if batch {
			var parts []string
			for _, o := range out {
				b, _ := json.Marshal(o)
				parts = append(parts, string(b))
			}
			c.Write(ctx, websocket.MessageText, []byte(strings.Join(parts, "\n")))
			continue
		}
		for _, o := range out {
			b, _ := json.Marshal(o)
			c.Write(ctx, websocket.MessageText, b)
		}
	}
}

// pushAll sends e to every open connection.
func (f *fakeServer) pushAll(ctx context.Context, e *protocol.Event) {
	f.mu.Lock()
	conns := append([]*websocket.Conn(nil), f.conns...)
	f.mu.Unlock()
	cp := *e
	cp.Op = protocol.OpEvent
	b, _ := json.Marshal(&cp)
	for _, c := range conns {
		c.Write(ctx, websocket.MessageText, b)
		if f.dupPush {
			c.Write(ctx, websocket.MessageText, b)
		}
	}
}

// closeAll closes every connection (the client sees a drop).
func (f *fakeServer) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.CloseNow()
	}
}

// handle applies req and returns the frames to answer and the events to push.
func (f *fakeServer) handle(req *protocol.Request) (out []any, push []*protocol.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch req.Op {
	case protocol.OpCreate, protocol.OpSend, protocol.OpJoin, protocol.OpKick, protocol.OpLeave:
		key := req.ConversationID + "/" + req.ClientMessageID
		if r, ok := f.done[key]; ok && req.ClientMessageID != "" {
			cp := *r
			cp.ID = req.ID
			return []any{&cp}, nil
		}
		evs := f.convs[req.ConversationID]
		if req.Op == protocol.OpCreate && len(evs) > 0 {
			return []any{protocol.Rejected(req.ID, protocol.Errorf(protocol.CodeConflict, "exists"))}, nil
		}
		f.nmsg++
		e := &protocol.Event{ConversationID: req.ConversationID, Seq: int64(len(evs) + 1), Kind: req.Op, MessageID: fmt.Sprintf("M%d", f.nmsg),
			Sender: "u1", Body: req.Body, UserID: req.UserID, Members: req.Members, ClientMessageID: req.ClientMessageID, CreatedAt: protocol.FormatTime(time.Now())}
		if req.Op == protocol.OpSend {
			e.Kind = "message"
		}
		f.convs[req.ConversationID] = append(evs, e)
		r := &protocol.Reply{Op: protocol.OpAccepted, ID: req.ID, ConversationID: req.ConversationID, Seq: e.Seq, MessageID: e.MessageID, ClientMessageID: req.ClientMessageID}
		f.done[key] = r
		return []any{r}, []*protocol.Event{e}
	case protocol.OpSync:
		cur := map[string]int64{}
		n := 0
		more := false
		for conv, evs := range f.convs {
			c := req.Cursors[conv]
			for _, e := range evs {
				if e.Seq <= c {
					continue
				}
				if n == f.syncPage {
					more = true
					break
				}
				cp := *e
				cp.Op = protocol.OpEvent
				out = append(out, &cp)
				n++
				c = e.Seq
			}
			cur[conv] = c
		}
		return append(out, &protocol.Synced{Op: protocol.OpSynced, ID: req.ID, Cursors: cur, More: more}), nil
	case protocol.OpHistory:
		var page []*protocol.Event
		for _, e := range f.convs[req.ConversationID] {
			if req.BeforeSeq == 0 || e.Seq < req.BeforeSeq {
				page = append(page, e)
			}
		}
		lim := req.Limit
		if lim == 0 {
			lim = 50
		}
		if len(page) > lim {
			page = page[len(page)-lim:]
		}
		if page == nil {
			page = []*protocol.Event{}
		}
		return []any{&protocol.HistoryPage{Op: protocol.OpHistory, ID: req.ID, ConversationID: req.ConversationID, Events: page}}, nil
	case protocol.OpConversations:
		var list []*protocol.ConversationInfo
		for conv, evs := range f.convs {
			list = append(list, &protocol.ConversationInfo{ConversationID: conv, LastSeq: int64(len(evs)), LastActivityAt: evs[len(evs)-1].CreatedAt})
		}
		return []any{&protocol.ConversationList{Op: protocol.OpConversations, ID: req.ID, Conversations: list}}, nil
	}
	return []any{protocol.Rejected(req.ID, protocol.Errorf(protocol.CodeBadRequest, "unknown op"))}, nil
}

// requests returns the requests seen with op.
func (f *fakeServer) requests(op string) []seenReq {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []seenReq
	for _, r := range f.reqs {
		if r.req.Op == op {
			out = append(out, r)
		}
	}
	return out
}

// messages returns the message events stored in conv.
func (f *fakeServer) messages(conv string) []*protocol.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*protocol.Event
	for _, e := range f.convs[conv] {
		if e.Kind == "message" {
			out = append(out, e)
		}
	}
	return out
}

// add stores an event directly (another user's message).
func (f *fakeServer) add(conv, body string) *protocol.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	evs := f.convs[conv]
	f.nmsg++
	e := &protocol.Event{ConversationID: conv, Seq: int64(len(evs) + 1), Kind: "message", MessageID: fmt.Sprintf("M%d", f.nmsg), Sender: "u2", Body: body, CreatedAt: protocol.FormatTime(time.Now())}
	f.convs[conv] = append(evs, e)
	return e
}

// checkToken applies the gateway's token rules (fakeServer.tokens) to a
// request of connection conn: "" to handle it, or the answer.
func (f *fakeServer) checkToken(conn int, req *protocol.Request) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Op == protocol.OpRefresh {
		exp, ok := tokenExpiry(req.Token)
		if !ok || time.Now().After(exp) {
			return `{"op":"rejected","id":"` + req.ID + `","code":"unauthorized","message":"bad token"}`
		}
		f.connTok[conn] = req.Token
		return `{"op":"accepted","id":"` + req.ID + `","expires_at":"` + protocol.FormatTime(exp) + `"}`
	}
	if exp, _ := tokenExpiry(f.connTok[conn]); time.Now().After(exp) {
		return `{"op":"rejected","id":"` + req.ID + `","code":"unauthorized","message":"the token expired"}`
	}
	return ""
}
