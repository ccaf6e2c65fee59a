package logsink

import (
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestNextOffsets(t *testing.T) {
	recs := []*kgo.Record{{Partition: 0, Offset: 4}, {Partition: 1, Offset: 9}, {Partition: 0, Offset: 7}}
	if got, want := NextOffsets(recs), map[int32]int64{0: 8, 1: 10}; !reflect.DeepEqual(got, want) {
		t.Errorf("NextOffsets = %v, want %v", got, want)
	}
}
