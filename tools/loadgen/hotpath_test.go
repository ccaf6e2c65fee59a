package loadgen

import (
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// peakFanout is the events one message makes at the peak profile: its
// conversation's members (1:1s have 2, groups about 6 on average with the
// u⁵ size law; 80/20 mix → about 3.3) times 2 devices each.
const peakFanout = 7

// BenchmarkMessageHotPath is loadgen's own work per message at the peak
// mix, without the sockets: encode the send, decode the `accepted` answer
// and record it, decode and record the message's events on its members'
// devices. The goal is ≤ 15 µs per message.
func BenchmarkMessageHotPath(b *testing.B) {
	dir := b.TempDir()
	r := &runner{cfg: Config{Timeout: 10 * time.Second}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		accLat: newLatency(), delLat: newLatency(), rejects: map[string]int64{}, retries: map[string]int64{}, refused: map[string]int64{}}
	var err error
	for _, s := range []struct {
		p    **stream
		name string
	}{{&r.acc, AcceptedFile}, {&r.del, DeliveredFile}, {&r.rej, RejectedFile}, {&r.gup, GaveUpFile}} {
		if *s.p, err = openStream(filepath.Join(dir, s.name)); err != nil {
			b.Fatal(err)
		}
	}
	defer r.acc.close()
	defer r.del.close()
	d := newDevice(r, "run.u1", 0)
	due := time.Now()
	body := messageBody("m1", due, 100)
	accepted := []byte(`{"op":"accepted","id":"r1","conversation_id":"run.c17","seq":1234,"message_id":"01KAZ5N3W8Q4M2R6T8V0X2Z4B6","client_message_id":"m1"}`)
	ev, _ := json.Marshal(map[string]any{"op": "event", "conversation_id": "run.c17", "seq": 1234, "kind": "message",
		"message_id": "01KAZ5N3W8Q4M2R6T8V0X2Z4B6", "client_message_id": "m1", "sender": "run.u1", "body": body,
		"created_at": "2026-12-01T10:00:00.123456Z"})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o := &op{kind: "send", conv: "run.c17", cmid: "m" + strconv.Itoa(i), body: body, due: due}
		d.encode(o, "r1")
		o.sent, o.sentAttempt, o.attempts = due, due, 1
		d.pending["r1"] = o
		d.dispatch(accepted, time.Now())
		for k := 0; k < peakFanout; k++ {
			d.dispatch(ev, time.Now())
		}
	}
}
