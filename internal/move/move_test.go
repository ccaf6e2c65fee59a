package move

import (
	"strings"
	"testing"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
)

// PickDedicated takes the vshard asked for if it is dedicated, keeps a
// conversation where it is routed already, and otherwise takes the first
// dedicated vshard no other conversation is routed to — a release in
// progress (an override naming a hashed vshard) frees none.
func TestPickDedicated(t *testing.T) {
	l := logrecord.Layout{VShards: 16, Partitions: 4, Dedicated: 3} // dedicated: 16, 17, 18
	routes := map[string]lease.Override{"a": {VShard: 16}, "b": {VShard: 3}, "c": {VShard: 17}}
	for _, tc := range []struct {
		name    string
		cid     string
		want    int
		got     int
		errPart string
	}{
		{"asked for a dedicated one", "x", 18, 18, ""},
		{"asked for one taken: the operator's choice", "x", 16, 16, ""},
		{"asked for a hashed one", "x", 3, 0, "not a dedicated vshard (they are 16–18)"},
		{"asked for one past the last", "x", 19, 0, "not a dedicated vshard"},
		{"routed already", "c", -1, 17, ""},
		{"first free", "x", -1, 18, ""},
		{"being released home: a free one", "b", -1, 18, ""},
	} {
		got, err := PickDedicated(l, routes, tc.cid, tc.want)
		switch {
		case tc.errPart != "":
			if err == nil || !strings.Contains(err.Error(), tc.errPart) {
				t.Errorf("%s: %d, %v; want an error with %q", tc.name, got, err, tc.errPart)
			}
		case err != nil || got != tc.got:
			t.Errorf("%s: %d, %v; want %d", tc.name, got, err, tc.got)
		}
	}
	full := map[string]lease.Override{"a": {VShard: 16}, "c": {VShard: 17}, "d": {VShard: 18}}
	if v, err := PickDedicated(l, full, "x", -1); err == nil || !strings.Contains(err.Error(), "every dedicated vshard (16–18) has a conversation") {
		t.Errorf("every dedicated vshard taken: %d, %v", v, err)
	}
}
