package logsink

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/pgtest"
)

// TestReadOffsets: Offset, Offsets and AllOffsets read what storeOffsets
// wrote, per consumer and topic; a partition with nothing stored is not ok.
func TestReadOffsets(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	store := func(consumer, topic string, recs ...*kgo.Record) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return storeOffsets(ctx, tx, consumer, topic, recs) }); err != nil {
			t.Fatal(err)
		}
	}
	store("b", testTopic, &kgo.Record{Partition: 1, Offset: 7}, &kgo.Record{Partition: 0, Offset: 2})
	store("a", testTopic, &kgo.Record{Partition: 0, Offset: 4})
	store("a", "other", &kgo.Record{Partition: 0, Offset: 40})

	if offs, err := Offsets(ctx, db, "a", testTopic); err != nil || len(offs) != 1 || offs[0] != 5 {
		t.Errorf("Offsets(a) = %v, %v; want 0: 5 alone", offs, err)
	}
	if offs, err := Offsets(ctx, db, "b", testTopic); err != nil || len(offs) != 2 || offs[0] != 3 || offs[1] != 8 {
		t.Errorf("Offsets(b) = %v, %v; want 0: 3, 1: 8", offs, err)
	}
	all, err := AllOffsets(ctx, db, testTopic)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		consumer string
		part     int32
		next     int64
	}
	var got []row
	for _, o := range all {
		if o.UpdatedAt.IsZero() {
			t.Errorf("%+v: no updated_at", o)
		}
		got = append(got, row{o.Consumer, o.Partition, o.NextOffset})
	}
	want := []row{{"a", 0, 5}, {"b", 0, 3}, {"b", 1, 8}}
	if len(got) != len(want) {
		t.Fatalf("AllOffsets = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("AllOffsets = %+v, want %+v", got, want)
		}
	}
}
