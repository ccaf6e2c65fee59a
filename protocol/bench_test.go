package protocol_test

import (
	"testing"

	"github.com/chatpipe/chatpipe/protocol"
)

// BenchmarkDecodeSend is the gateway's per-frame cost of the hottest
// command: parse and validate one send.
func BenchmarkDecodeSend(b *testing.B) {
	frame := []byte(`{"op":"send","id":"r12345","conversation_id":"g-000123","client_message_id":"u-000042-000000001234","body":"hello there, this is a message of a typical length for a chat app"}`)
	lim := protocol.DefaultLimits()
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, _, err := protocol.Decode(frame, lim); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDecodeCopies: a decoded request owns its strings; the websocket
// reader may reuse the frame's buffer for the next frame.
func TestDecodeCopies(t *testing.T) {
	frame := []byte(`{"op":"send","id":"r1","conversation_id":"c1","client_message_id":"m1","body":"hello"}`)
	r, _, err := protocol.Decode(frame, protocol.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	for i := range frame {
		frame[i] = 'X'
	}
	if r.Op != "send" || r.ID != "r1" || r.ConversationID != "c1" || r.ClientMessageID != "m1" || r.Body != "hello" {
		t.Fatalf("the request changed with its frame's buffer: %+v", r)
	}
}
