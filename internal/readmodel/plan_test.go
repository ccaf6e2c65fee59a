package readmodel

import (
	"reflect"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
)

func ev(conv string, seq int64, kind, sender, user string, members ...string) *logrecord.Event {
	return &logrecord.Event{ConversationID: conv, Seq: seq, Kind: kind, Sender: sender, UserID: user, Members: members,
		CreatedAt: time.Unix(seq, 0)}
}

func TestPlanBatch(t *testing.T) {
	p := PlanBatch([]*logrecord.Event{
		ev("b", 1, logrecord.KindCreate, "alice", "", "bob", "alice", "carol"),
		{Kind: logrecord.KindTakeover, VShard: 3},
		ev("a", 7, logrecord.KindMessage, "x", ""),
		ev("b", 2, logrecord.KindMessage, "bob", ""),
		ev("b", 3, logrecord.KindKick, "alice", "bob"),
		ev("b", 4, logrecord.KindJoin, "carol", "bob"),
		ev("b", 5, logrecord.KindLeave, "carol", "carol"),
		ev("a", 8, logrecord.KindMessage, "x", ""),
	})
	wantMembers := []MemberOp{
		{Conv: "b", User: "alice", Seq: 1, Join: true},
		{Conv: "b", User: "bob", Seq: 1, Join: true},
		{Conv: "b", User: "carol", Seq: 1, Join: true},
		{Conv: "b", User: "bob", Seq: 3},
		{Conv: "b", User: "bob", Seq: 4, Join: true},
		{Conv: "b", User: "carol", Seq: 5},
	}
	if !reflect.DeepEqual(p.Members, wantMembers) {
		t.Errorf("members:\n got %+v\nwant %+v", p.Members, wantMembers)
	}
	wantConvs := []Touched{
		{Conv: "a", From: 7, To: 8, LastAt: time.Unix(8, 0)},
		{Conv: "b", From: 1, To: 5, LastAt: time.Unix(5, 0)},
	}
	if !reflect.DeepEqual(p.Convs, wantConvs) {
		t.Errorf("convs:\n got %+v\nwant %+v", p.Convs, wantConvs)
	}
}

func TestPlanBatchOnlyMarkers(t *testing.T) {
	p := PlanBatch([]*logrecord.Event{{Kind: logrecord.KindTakeover, VShard: 1}})
	if len(p.Members) != 0 || len(p.Convs) != 0 {
		t.Errorf("a batch of takeover markers planned %+v", p)
	}
}
