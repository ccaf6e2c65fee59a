package logsink

import (
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The NOTIFY payload a batch's commit announces: the offsets it stored.

// maxPayload keeps an announcement under Postgres's 8000-byte NOTIFY
// payload limit: a larger one is sent empty.
const maxPayload = 7000

// AnnouncePayload is the payload a batch of recs (of topic) is announced
// with: "topic p:o,p:o…", the next offset it stored for each partition of
// the batch ("" when it would not fit a notification). A listener may
// take those offsets as stored: the notification is delivered only once
// the transaction that stored them committed.
func AnnouncePayload(topic string, recs []*kgo.Record) string {
	parts, offs := nextOffsetArrays(recs)
	b := make([]byte, 0, len(topic)+1+len(parts)*12)
	b = append(b, topic...)
	b = append(b, ' ')
	for i, p := range parts {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(p), 10)
		b = append(b, ':')
		b = strconv.AppendInt(b, offs[i], 10)
	}
	if len(b) > maxPayload {
		return ""
	}
	return string(b)
}

// ParseAnnounce reads an AnnouncePayload of topic: the stored next offset
// of each partition it names (nil for another topic, an empty or an
// unreadable payload).
func ParseAnnounce(topic, payload string) map[int32]int64 {
	t, rest, ok := strings.Cut(payload, " ")
	if !ok || t != topic || rest == "" {
		return nil
	}
	out := map[int32]int64{}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, ":")
		p, err1 := strconv.ParseInt(k, 10, 32)
		o, err2 := strconv.ParseInt(v, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil
		}
		out[int32(p)] = max(out[int32(p)], o)
	}
	return out
}
