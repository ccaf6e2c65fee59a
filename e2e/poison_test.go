package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/chatpipe/chatpipe/protocol"
)

// TestPoisonBodies: a body no sink can store (NUL, which Postgres text
// cannot hold), if accepted and committed, would stop persist for every
// conversation. Each such input is refused at the edge, nothing of it
// reaches the log, and a normal message sent right after it is in Postgres
// and delivered to the other member within seconds.
func TestPoisonBodies(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir())
	alice := dev.Dial(t, "alice")
	alice.Must(map[string]any{"op": "create", "conversation_id": "pz", "members": []string{"bob"}})

	// bob's device reads pushed events.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bob, _, err := websocket.Dial(ctx, dev.EP.WebSocket+"?token="+dev.Token(t, "bob"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bob.CloseNow()
	events := make(chan protocol.Event, 64)
	go func() {
		for {
			_, b, err := bob.Read(ctx)
			if err != nil {
				return
			}
			var e protocol.Event
			if json.Unmarshal(b, &e) == nil && e.Op == protocol.OpEvent {
				events <- e
			}
		}
	}()

	poison := map[string]string{
		"escaped NUL":       `"a\u0000b"`,
		"NUL alone":         `"\u0000"`,
		"lone surrogate":    `"x\ud800y"`,
		"reversed pair":     `"\udc00\ud800"`,
		"raw invalid UTF-8": "\"a\xffb\"",
	}
	n := 0
	for name, body := range poison {
		n++
		id := "poison" + string(rune('a'+n))
		frame := `{"op":"send","id":"` + id + `","conversation_id":"pz","client_message_id":"poison-1","body":` + body + `}`
		r, err := alice.DoFrame(id, frame)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.Op != protocol.OpRejected || r.Code != protocol.CodeBadRequest {
			t.Errorf("%s: %+v, want rejected bad_request", name, r)
		}
	}
	sent := time.Now()
	ok := alice.Must(map[string]any{"op": "send", "conversation_id": "pz", "client_message_id": "after-poison", "body": "still here"})
	if ok.Seq != 2 {
		t.Errorf("the message after the poison has seq %d, want 2: something poisonous was accepted", ok.Seq)
	}

	conn, err := pgx.Connect(ctx, dev.EP.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for {
		var body string
		err := conn.QueryRow(ctx, `SELECT body FROM events WHERE conversation_id = 'pz' AND client_message_id = 'after-poison'`).Scan(&body)
		if err == nil {
			t.Logf("in Postgres %v after it was sent", time.Since(sent).Round(time.Millisecond))
			break
		}
		if time.Since(sent) > 10*time.Second {
			t.Fatalf("the message after the poison is not in Postgres after 10 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		select {
		case e := <-events:
			if e.ConversationID == "pz" && e.Seq == ok.Seq {
				if e.Body != "still here" {
					t.Errorf("delivered body %q", e.Body)
				}
				t.Logf("delivered %v after it was sent", time.Since(sent).Round(time.Millisecond))
				goto delivered
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the message after the poison was not delivered within 10 s")
		}
	}
delivered:
	for _, r := range readLog(t, dev.EP) {
		if r.Kind == "message" && (strings.ContainsRune(r.Body, 0) || r.ClientMessageID == "poison-1") {
			t.Errorf("poison reached the log: %+v", r)
		}
	}
}
