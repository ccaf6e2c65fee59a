package gateway

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/delivery"
	"github.com/chatpipe/chatpipe/protocol"
)

// BenchmarkDeliver is the feed's hand-off of one batch (16 event frames)
// to a user with one connected device that reads everything, through the
// connection's writer to the socket: the gateway's share of delivering
// events, per batch. plain: one websocket message per frame; batch: a
// device that asked for chatpipe.v1.batch (frames joined per message).
func BenchmarkDeliver(b *testing.B) {
	for _, c := range []struct {
		name  string
		proto []string
	}{{"plain", nil}, {"batch", []string{protocol.SubprotocolBatch}}} {
		b.Run(c.name, func(b *testing.B) {
			g, srv := readGateway(b, &fakeReads{}, nil)
			w := dialWS(b, srv, "u1", c.proto...)
			w.c.SetReadLimit(1 << 20) // a batched message may be up to maxBatchBytes
			for !g.Local("u1") {
				time.Sleep(time.Millisecond)
			}
			pushes := make([]delivery.Push, 16)
			for i := range pushes {
				pushes[i] = delivery.Push{Conv: "c1", Seq: int64(i + 1), Frame: []byte(fmt.Sprintf(`{"op":"event","conversation_id":"c1","seq":%d,"body":"a message body of a typical length"}`, i+1))}
			}
			done := make(chan struct{})
			want := b.N * len(pushes)
			go func() {
				defer close(done)
				for n := 0; n < want; {
					_, m, err := w.c.Read(context.Background())
					if err != nil {
						return
					}
					n += 1 + bytes.Count(m, []byte{'\n'})
				}
			}()
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				g.Deliver("u1", pushes)
				for len(onlySession(g, "u1").out) > 512 { // a reader keeping up
					time.Sleep(10 * time.Microsecond)
				}
			}
			<-done
		})
	}
}
