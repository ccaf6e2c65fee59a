package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	chatclient "github.com/chatpipe/chatpipe/client"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestRetriedJoinAfterRemovalAddsNobody: a keyed join of a current member
// writes nothing; its retry, arriving after the member left or was
// kicked, gets the same answer and writes nothing either — one command, at
// most one effect (docs/protocol.md, join of a current member). The first
// case is the Go client's own retry: its connection is lost before the
// join's answer arrives, the member leaves meanwhile, and the client sends
// the join again on its next connection. The second sends the same join
// frame again on a plain connection after a kick. Afterwards neither
// conversation's log holds a join after the removal, the member's
// membership periods in Postgres end at it, and their send is forbidden.
func TestRetriedJoinAfterRemovalAddsNobody(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir())
	owner := dev.Dial(t, "jr-owner")
	member := dev.Dial(t, "jr-member")
	created := map[string]int64{}
	for _, conv := range []string{"jr-left", "jr-kicked"} {
		created[conv] = owner.Must(map[string]any{"op": "create", "conversation_id": conv, "members": []string{"jr-member"}}).Seq
	}
	metrics := dev.EP.Admin + "/metrics"
	joinsAnswered := func() float64 {
		return stacktest.MetricLabeled(t, metrics, "chatpipe_gateway_commands_total", `op="join"`, `result="accepted"`)
	}

	// The Go client's join, answered while its answer is swallowed; the
	// member leaves while the client cannot reconnect; then it does, and
	// sends the join again with the same client_message_id.
	proxy, ws := newProxy(t, dev.EP.WebSocket)
	const joinKey = "jr-join-of-a-member"
	gc := dialClient(t, dev, ws, "jr-owner", nil, chatclient.Options{NewID: func() string { return joinKey },
		RequestTimeout: time.Minute, MaxBackoff: 200 * time.Millisecond})
	before := joinsAnswered()
	proxy.set(true, false)
	type result struct {
		r   *protocol.Reply
		err error
	}
	joined := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	go func() {
		r, err := gc.Join(ctx, "jr-left", "jr-member")
		joined <- result{r, err}
	}()
	stacktest.WaitFor(t, 30*time.Second, "the gateway to answer the client's join of jr-member to jr-left", func() bool { return joinsAnswered() > before })
	proxy.set(true, true)
	proxy.cut()
	left := member.Must(map[string]any{"op": "leave", "conversation_id": "jr-left", "client_message_id": "jr-leave"}).Seq
	proxy.set(false, false)
	var res result
	select {
	case res = <-joined:
	case <-time.After(60 * time.Second):
		t.Fatal("the client's join of jr-member to jr-left was not answered within 60 s of its reconnect")
	}
	if res.err != nil || res.r.Op != protocol.OpAccepted || res.r.Seq != created["jr-left"] {
		t.Errorf("the client's retried join of jr-member to jr-left (after their leave at seq %d) answered %+v %v; want accepted with seq %d, the create that made them a member",
			left, res.r, res.err, created["jr-left"])
	}
	if n := gc.Connects(); n < 2 {
		t.Errorf("the client connected %d times: its join was not sent again on a new connection", n)
	}

	// The same join frame again on a plain connection, after a kick.
	join := map[string]any{"op": "join", "conversation_id": "jr-kicked", "user_id": "jr-member", "client_message_id": "jr-join-k"}
	if r := owner.Must(join); r.Seq != created["jr-kicked"] {
		t.Errorf("join of jr-member, a member of jr-kicked since seq %d, answered seq %d", created["jr-kicked"], r.Seq)
	}
	kicked := owner.Must(map[string]any{"op": "kick", "conversation_id": "jr-kicked", "user_id": "jr-member", "client_message_id": "jr-kick"}).Seq
	join = map[string]any{"op": "join", "conversation_id": "jr-kicked", "user_id": "jr-member", "client_message_id": "jr-join-k"}
	if r := owner.Must(join); r.Seq != created["jr-kicked"] {
		t.Errorf("the retried join of jr-member to jr-kicked (after the kick at seq %d) answered seq %d, want %d", kicked, r.Seq, created["jr-kicked"])
	}

	// The world: no join after the removal, periods that end at it, and a
	// send that is refused.
	removed := map[string]int64{"jr-left": left, "jr-kicked": kicked}
	rows := readLog(t, dev.EP)
	for _, r := range rows {
		if at, ok := removed[r.Conv]; ok && r.Seq > at && r.Kind != logrecord.KindMoved {
			t.Errorf("%s: %s of %s at seq %d, after the removal at seq %d", r.Conv, r.Kind, r.UserID, r.Seq, at)
		}
	}
	waitProjected(t, dev.EP, len(rows))
	got := projectedPeriods(t, dev.EP)
	for conv, at := range removed {
		want := [][2]int64{{created[conv], at}}
		if p := got[conv]["jr-member"]; fmt.Sprint(p) != fmt.Sprint(want) {
			t.Errorf("jr-member's membership periods of %s in Postgres are %v, want %v", conv, p, want)
		}
		r, err := member.SendRetrying(conv, "jr-after-"+conv, "am I in?")
		if err != nil || r.Code != protocol.CodeForbidden {
			t.Errorf("jr-member's send to %s after their removal answered %+v %v, want forbidden", conv, r, err)
		}
	}
}
