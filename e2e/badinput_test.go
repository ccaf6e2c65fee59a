package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestBadInput: bad frames get clear rejections and the connection stays
// usable; bad tokens get 401 at the upgrade; oversized frames close with
// 1009; nothing of it is written.
func TestBadInput(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// 401 at the upgrade: no token, garbage, wrong secret, expired.
	wrong, _ := auth.Mint([]byte("not-the-secret"), "eve", time.Hour, time.Now())
	expired, _ := auth.Mint(dev.Secret, "eve", time.Minute, time.Now().Add(-time.Hour))
	for name, tok := range map[string]string{"none": "", "garbage": "x.y.z", "wrong secret": wrong, "expired": expired} {
		_, resp, err := websocket.Dial(ctx, dev.EP.WebSocket+"?token="+tok, nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			t.Errorf("%s token: status %d err %v, want 401", name, code, err)
		}
	}
	// The header form works too.
	h := http.Header{"Authorization": {"Bearer " + dev.Token(t, "alice")}}
	c, _, err := websocket.Dial(ctx, dev.EP.WebSocket, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatalf("bearer header: %v", err)
	}
	defer c.CloseNow()

	long := strings.Repeat("a", 129)
	cases := []struct {
		frame, id, code string
	}{
		{`[1,2]`, "", "bad_request"},
		{`not json`, "", "bad_request"},
		{`"str"`, "", "bad_request"},
		{`{"op":"send"}`, "", "bad_request"},
		{`{"id":"a1","op":"nope"}`, "a1", "bad_request"},
		{`{"id":"a2","op":"send","conversation_id":"c","client_message_id":"m"}`, "a2", "bad_request"},
		{`{"id":"a3","op":"send","conversation_id":"c c","client_message_id":"m","body":"x"}`, "a3", "bad_request"},
		{`{"id":"a4","op":"send","conversation_id":"` + long + `","client_message_id":"m","body":"x"}`, "a4", "too_large"},
		{`{"id":"a5","op":"send","conversation_id":"c","client_message_id":"m","body":"` + strings.Repeat("b", 4097) + `"}`, "a5", "too_large"},
		{`{"id":"a6","op":"send","conversation_id":"c","client_message_id":"m","body":7}`, "a6", "bad_request"},
		{`{"id":"a7","op":"create","conversation_id":"c","members":"bob"}`, "a7", "bad_request"},
		{`{"id":"a8","op":"send","conversation_id":"nowhere","client_message_id":"m","body":"x"}`, "a8", "forbidden"},
	}
	for _, tc := range cases {
		if err := c.Write(ctx, websocket.MessageText, []byte(tc.frame)); err != nil {
			t.Fatal(err)
		}
		m, err := readRaw(ctx, c)
		if err != nil {
			t.Fatalf("%s: %v", tc.frame, err)
		}
		gotID, _ := m["id"].(string)
		if m["op"] != "rejected" || m["code"] != tc.code || gotID != tc.id {
			t.Errorf("%.60s: got %v, want rejected %s id %q", tc.frame, m, tc.code, tc.id)
		}
	}
	// Still usable, and the forged sender is ignored: the event's sender is alice.
	frame, _ := json.Marshal(map[string]any{"id": "ok1", "op": "create", "conversation_id": "c", "members": []string{"bob"}, "sender": "mallory"})
	c.Write(ctx, websocket.MessageText, frame)
	if m, err := readAnswer(ctx, c, "ok1"); err != nil || m["op"] != "accepted" {
		t.Fatalf("after bad frames: %v %v", m, err)
	}
	frame, _ = json.Marshal(map[string]any{"id": "ok2", "op": "send", "conversation_id": "c", "client_message_id": "m1", "body": "hi", "sender": "bob"})
	c.Write(ctx, websocket.MessageText, frame)
	// The create's event may be pushed before the send's answer.
	m, err := readAnswer(ctx, c, "ok2")
	if err != nil || m["op"] != "accepted" {
		t.Fatalf("send: %v %v", m, err)
	}
	// A frame over 64 KiB closes the connection with 1009.
	c.Write(ctx, websocket.MessageText, []byte(`{"id":"big","op":"send","body":"`+strings.Repeat("x", 70<<10)+`"}`))
	// Frames already on their way (the events pushed for the create and
	// the send) may come first: read until the connection ends.
	for err == nil {
		_, _, err = c.Read(ctx)
	}
	if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Errorf("oversized frame: %v, want close 1009", err)
	}
	rows := readLog(t, dev.EP)
	if len(rows) != 2 || rows[0].Sender != "alice" || rows[1].Sender != "alice" {
		t.Errorf("log holds %+v, want alice's create and send only", rows)
	}
}

// readAnswer reads frames until the answer to request id, skipping the
// events pushed meanwhile.
func readAnswer(ctx context.Context, c *websocket.Conn, id string) (map[string]any, error) {
	for {
		m, err := readRaw(ctx, c)
		if err != nil || m["id"] == id || m["op"] != protocol.OpEvent {
			return m, err
		}
	}
}
