package delivery

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkFeedDeliverReadMarkers is the feed's hand-off of a batch of 50
// outbox rows, each moving 4 users' read markers forward, to a gateway
// where every user has 2 devices: encoding, grouping by user, Deliver and
// the per-device counts (read markers need no Postgres).
func BenchmarkFeedDeliverReadMarkers(b *testing.B) {
	s := &sink{devices: map[string]int{}, got: map[string][]Push{}}
	var batch []outboxRow
	for i := range 50 {
		row := outboxRow{id: int64(i + 1)}
		for j := range 4 {
			u := fmt.Sprintf("u%d", (i*4+j)%120)
			s.devices[u] = 2
			row.readUsers = append(row.readUsers, u)
			row.readConvs = append(row.readConvs, fmt.Sprintf("c%d", i))
			row.readSeqs = append(row.readSeqs, int64(j+1))
		}
		batch = append(batch, row)
	}
	f := NewFeed(nil, s, nil)
	b.ReportAllocs()
	for b.Loop() {
		clear(s.got)
		if err := f.deliver(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
}
