package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/protocol"
)

// replyIDCases are frames with the id ReplyID must find (or not).
var replyIDCases = []struct {
	frame string
	id    string
	ok    bool
}{
	{`{"op":"accepted","id":"r1","seq":3}`, "r1", true},
	{` { "op" : "synced" , "cursors" : {"a":1,"id":2} , "id" : "c-9.x:y" } `, "c-9.x:y", true},
	{`{"op":"event","conversation_id":"c","body":"say \"id\":\"r1\" \\","seq":1}`, "", false},
	{`{"op":"history","events":[{"id":"x","body":"]}"}],"id":"r7"}`, "r7", true},
	{`{"op":"event","message_id":"m","client_message_id":"r2"}`, "", false},
	{`{"op":"rejected","id":"r\u0031"}`, "", false}, // escaped: not a request id
	{`{"id":3}`, "", false},
	{`{"more":true,"n":null,"f":-1.5e3,"id":"r4"}`, "r4", true},
	{`[{"id":"r1"}]`, "", false},
	{`{"op":"accepted","id":"r1`, "", false},
	{``, "", false},
	{`{}`, "", false},
}

func TestReplyID(t *testing.T) {
	for _, c := range replyIDCases {
		id, ok := ReplyID([]byte(c.frame))
		if ok != c.ok || string(id) != c.id {
			t.Errorf("ReplyID(%s) = %q, %v; want %q, %v", c.frame, id, ok, c.id, c.ok)
		}
	}
}

// FuzzReplyID checks ReplyID against encoding/json on every valid JSON
// object: it finds exactly the top-level string "id" (when unescaped).
func FuzzReplyID(f *testing.F) {
	for _, c := range replyIDCases {
		f.Add(c.frame)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, ok := ReplyID([]byte(s))
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(s), &m) != nil {
			return // not an object: ReplyID may say anything but must not panic
		}
		// The id as its raw bytes between the quotes (encoding/json would
		// replace invalid UTF-8; ReplyID does not decode).
		raw, has := m["id"]
		wantOK := has && len(raw) >= 2 && raw[0] == '"' && !strings.Contains(string(raw), `\`)
		var want string
		if wantOK {
			want = string(raw[1 : len(raw)-1])
		}
		if wantOK && !ok {
			// Duplicate keys: encoding/json keeps the last, ReplyID the
			// first; both are acceptable only when they differ by that.
			if dupKey(s) {
				return
			}
			t.Fatalf("ReplyID(%s) found none, want %q", s, want)
		}
		if ok && (!wantOK || string(id) != want) && !dupKey(s) {
			t.Fatalf("ReplyID(%s) = %q, want %q (%v)", s, id, want, wantOK)
		}
	})
}

// dupKey reports whether the object s names "id" more than once at its top
// level (or under another spelling that decodes to "id").
func dupKey(s string) bool {
	dec := json.NewDecoder(strings.NewReader(s))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	n := 0
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return false
		}
		if ks, _ := k.(string); ks == "id" {
			n++
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return false
		}
	}
	return n > 1
}

func TestConnRoutesAnswersByID(t *testing.T) {
	f := newFake(t)
	var mu sync.Mutex
	var others []string
	conn, err := DialConn(testCtx(t), f.url(), ConnOptions{Token: "tok-u1", Batch: true, OnFrame: func(b []byte) {
		mu.Lock()
		others = append(others, string(b))
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	if conn.Subprotocol() != protocol.SubprotocolBatch {
		t.Fatalf("subprotocol %q", conn.Subprotocol())
	}
	// Many calls at once on one connection: each gets its own answer.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := conn.NewID()
			req := fmt.Sprintf(`{"op":"send","id":%q,"conversation_id":"c1","client_message_id":"m%d","body":"b%d"}`, id, i, i)
			b, err := conn.Call(testCtx(t), id, []byte(req))
			if err != nil {
				errs <- err
				return
			}
			var r protocol.Reply
			if err := json.Unmarshal(b, &r); err != nil || r.ID != id || r.Op != protocol.OpAccepted || r.ClientMessageID != fmt.Sprintf("m%d", i) {
				errs <- fmt.Errorf("call %s answered %s", id, b)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Pushed events answer nobody: they go to OnFrame.
	waitUntil(t, "20 events at OnFrame", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(others) >= 20
	})
	mu.Lock()
	for _, o := range others {
		var e protocol.Event
		if err := json.Unmarshal([]byte(o), &e); err != nil || e.Op != protocol.OpEvent {
			t.Errorf("OnFrame got %s", o)
		}
	}
	mu.Unlock()
}

func TestConnForgottenAnswerGoesToOnFrame(t *testing.T) {
	f := newFake(t)
	got := make(chan string, 4)
	conn, err := DialConn(testCtx(t), f.url(), ConnOptions{Token: "tok-u1", OnFrame: func(b []byte) { got <- string(b) }})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var called atomic.Bool
	if err := conn.Go(testCtx(t), "x1", []byte(`{"op":"conversations","id":"x1"}`), func([]byte) { called.Store(true) }); err != nil {
		t.Fatal(err)
	}
	conn.Forget("x1")
	// The answer may come before Forget; then the handler has it.
	b, err := conn.Call(testCtx(t), "x2", []byte(`{"op":"conversations","id":"x2"}`))
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := ReplyID(b); string(id) != "x2" {
		t.Fatalf("x2 answered %s", b)
	}
	if !called.Load() {
		select {
		case o := <-got:
			if id, _ := ReplyID([]byte(o)); string(id) != "x1" {
				t.Fatalf("OnFrame got %s, want x1's answer", o)
			}
		default:
			t.Fatal("x1's answer reached neither its handler nor OnFrame")
		}
	}
}

func TestConnCallEndsWhenConnectionEnds(t *testing.T) {
	f := newFake(t)
	f.hook = func(int, *protocol.Request) string { return "drop" }
	conn, err := DialConn(testCtx(t), f.url(), ConnOptions{Token: "tok-u1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Call(testCtx(t), "r1", []byte(`{"op":"conversations","id":"r1"}`))
	if !errors.Is(err, ErrConnLost) {
		t.Fatalf("call on a dropped connection: %v, want ErrConnLost", err)
	}
	<-conn.Done()
	if conn.Err() == nil {
		t.Fatal("Err is nil after Done")
	}
	conn.CloseNow() // after the end: returns at once
}

// Every frame reaches OnFrame whatever the sizes of the messages around
// it: a small message after a large one (which grows the read buffer)
// once got lost when the buffer was given up.
func TestConnDeliversEveryMessage(t *testing.T) {
	sizes := []int{10, 300 << 10, 10, 70 << 10, 20, 1 << 20, 5, 40 << 10, 3}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		for i, n := range sizes {
			// Two frames in one message, as a batching gateway sends them.
			msg := fmt.Sprintf(`{"op":"event","seq":%d,"body":%q}`+"\n"+`{"op":"event","seq":%d}`, 2*i+1, strings.Repeat("x", n), 2*i+2)
			if err := c.Write(r.Context(), websocket.MessageText, []byte(msg)); err != nil {
				return
			}
		}
		c.Read(r.Context()) // until the client goes
	}))
	defer ts.Close()
	var mu sync.Mutex
	var seqs []int64
	conn, err := DialConn(testCtx(t), "ws"+strings.TrimPrefix(ts.URL, "http"), ConnOptions{ReadLimit: 2 << 20, OnFrame: func(b []byte) {
		var e protocol.Event
		if err := json.Unmarshal(b, &e); err != nil {
			t.Errorf("frame %.80s: %v", b, err)
			return
		}
		mu.Lock()
		seqs = append(seqs, e.Seq)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	waitUntil(t, "every frame at OnFrame", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seqs) >= 2*len(sizes)
	})
	mu.Lock()
	defer mu.Unlock()
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("frames arrived as seqs %v, want 1..%d in order", seqs, 2*len(sizes))
		}
	}
}
