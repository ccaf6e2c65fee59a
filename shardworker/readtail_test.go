package shardworker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/kafkatest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// TestReplayStopsAtUnreadableRecord: a record of the vshard that does not
// decode fails the replay (the takeover is retried) instead of being
// skipped, which would let the new owner hand its seq out again. Records of
// other vshards are not read.
func TestReplayStopsAtUnreadableRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	brokers := []string{kafkatest.Broker(t).Addr()}
	for _, c := range []struct {
		name, value string
		want        error
	}{
		{"newer-version", `{"v":99,"kind":"message","conversation_id":"c1","seq":2}`, logrecord.ErrUnsupportedVersion},
		{"not-json", `{"v":1,"kind":"mess`, logrecord.ErrMalformed},
		{"other-vshard", "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			topic := "replay-" + c.name
			cl := kafkatest.Topic(ctx, t, brokers, topic)
			produce := func(vshard, value string) {
				t.Helper()
				r := &kgo.Record{Value: []byte(value), Headers: []kgo.RecordHeader{{Key: logrecord.HeaderVShard, Value: []byte(vshard)}}}
				if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			produce("3", `{"v":1,"kind":"message","conversation_id":"c1","seq":1,"message_id":"m1","sender":"u"}`)
			produce("4", `garbage of another vshard`)
			if c.value != "" {
				produce("3", c.value)
			}
			produce("3", `{"v":1,"kind":"takeover","vshard":3,"epoch":2}`) // the marker
			end := int64(3)
			if c.value == "" {
				end = 2
			}
			evs, err := readTail(ctx, brokers, topic, 0, kgo.NewOffset().AtStart(), end, 3, false)
			if c.want == nil {
				if err != nil || len(evs) != 1 {
					t.Fatalf("readTail = %d events, %v; want 1, nil", len(evs), err)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("readTail = %d events, %v; want %v", len(evs), err, c.want)
			}
		})
	}
}
