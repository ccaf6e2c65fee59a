package logsink

import (
	"reflect"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// An announcement carries each partition's next offset, and is read back
// only for its own topic.
func TestAnnouncePayload(t *testing.T) {
	recs := []*kgo.Record{{Partition: 2, Offset: 10}, {Partition: 2, Offset: 11}, {Partition: 0, Offset: 5}}
	p := AnnouncePayload("chatpipe.log", recs)
	if p != "chatpipe.log 2:12,0:6" {
		t.Fatalf("payload %q", p)
	}
	if got := ParseAnnounce("chatpipe.log", p); !reflect.DeepEqual(got, map[int32]int64{2: 12, 0: 6}) {
		t.Fatalf("parsed %v", got)
	}
	for _, bad := range []string{"", "other.topic 2:12", "chatpipe.log ", "chatpipe.log 2:x", "chatpipe.log 2", "chatpipe.log"} {
		if got := ParseAnnounce("chatpipe.log", bad); got != nil {
			t.Errorf("ParseAnnounce(%q) = %v, want nil", bad, got)
		}
	}
	many := make([]*kgo.Record, 2000)
	for i := range many {
		many[i] = &kgo.Record{Partition: int32(i), Offset: 1 << 40}
	}
	if p := AnnouncePayload("chatpipe.log", many); p != "" {
		t.Errorf("a payload of %d bytes was not left empty", len(p))
	}
	if p := AnnouncePayload(strings.Repeat("t", 10), recs[:1]); p != "tttttttttt 2:11" {
		t.Errorf("payload %q", p)
	}
}
