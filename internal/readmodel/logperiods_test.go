package readmodel

import (
	"fmt"
	"math"
	"testing"

	"github.com/chatpipe/chatpipe/logrecord"
)

func TestLogPeriods(t *testing.T) {
	const open = math.MaxInt64
	for _, tc := range []struct {
		name   string
		events []*logrecord.Event
		want   map[string]string // conversation/user → periods
	}{
		{"create opens the sender's and each member's, once",
			[]*logrecord.Event{ev("c", 1, logrecord.KindCreate, "a", "", "a", "b", "b")},
			map[string]string{"c/a": fmt.Sprintf("[1 %d]", open), "c/b": fmt.Sprintf("[1 %d]", open)}},
		{"a kick closes at its seq, a join opens again",
			[]*logrecord.Event{
				ev("c", 1, logrecord.KindCreate, "a", "", "b"),
				ev("c", 2, logrecord.KindMessage, "b", ""),
				ev("c", 3, logrecord.KindKick, "a", "b"),
				ev("c", 5, logrecord.KindJoin, "a", "b"),
				ev("c", 6, logrecord.KindLeave, "b", "b"),
			},
			map[string]string{"c/a": fmt.Sprintf("[1 %d]", open), "c/b": "[1 3] [5 6]"}},
		{"a join of a member opens nothing",
			[]*logrecord.Event{ev("c", 1, logrecord.KindCreate, "a", "", "b"), ev("c", 2, logrecord.KindJoin, "a", "b")},
			map[string]string{"c/a": fmt.Sprintf("[1 %d]", open), "c/b": fmt.Sprintf("[1 %d]", open)}},
		{"a removal of a non-member closes nothing",
			[]*logrecord.Event{ev("c", 1, logrecord.KindCreate, "a", ""), ev("c", 2, logrecord.KindKick, "a", "x")},
			map[string]string{"c/a": fmt.Sprintf("[1 %d]", open)}},
		{"events out of seq order, markers and two conversations",
			[]*logrecord.Event{
				ev("d", 2, logrecord.KindJoin, "a", "z"),
				ev("c", 4, logrecord.KindJoin, "a", "b"),
				{Kind: logrecord.KindTakeover, VShard: 3},
				ev("c", 3, logrecord.KindKick, "a", "b"),
				{Kind: logrecord.KindRead, ConversationID: "c", UserID: "b", ReadSeq: 2},
				ev("c", 1, logrecord.KindCreate, "a", "", "b"),
				ev("d", 1, logrecord.KindCreate, "y", ""),
			},
			map[string]string{"c/a": fmt.Sprintf("[1 %d]", open), "c/b": fmt.Sprintf("[1 3] [4 %d]", open),
				"d/y": fmt.Sprintf("[1 %d]", open), "d/z": fmt.Sprintf("[2 %d]", open)}},
		{"a leave without user_id changes nothing",
			[]*logrecord.Event{ev("c", 1, logrecord.KindCreate, "a", "", "b"), ev("c", 2, logrecord.KindLeave, "b", "")},
			map[string]string{"c/a": fmt.Sprintf("[1 %d]", open), "c/b": fmt.Sprintf("[1 %d]", open)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]string{}
			for conv, users := range LogPeriods(tc.events) {
				for u, ps := range users {
					s := ""
					for i, p := range ps {
						if p.Conv != conv || p.User != u {
							t.Errorf("period %+v filed under %s/%s", p, conv, u)
						}
						if i > 0 {
							s += " "
						}
						s += fmt.Sprintf("[%d %d]", p.From, p.To)
					}
					got[conv+"/"+u] = s
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestCoversAny(t *testing.T) {
	ps := []Period{NewPeriod("c", "u", 1, ptr(3)), NewPeriod("c", "u", 6, nil)}
	for seq, want := range map[int64]bool{1: true, 3: true, 4: false, 5: false, 6: true, 1 << 50: true} {
		if got := CoversAny(ps, seq); got != want {
			t.Errorf("CoversAny(%d) = %v", seq, got)
		}
	}
	if CoversAny(nil, 1) {
		t.Error("no periods cover a seq")
	}
}
