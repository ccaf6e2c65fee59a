package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestMoveProjectsInSeqOrder: a member joins a conversation, the
// conversation is isolated to a dedicated vshard, and its owner kicks the
// member there — while the projection group member that has the old
// partition is held back (CHATPIPE_FAULT_PROJECTION_HOLD), so the other
// member, which has the new partition, applies the kick before the join it
// ends (docs/architecture.md, rule 25). Once the old partition is applied
// too, the conversation's membership periods in Postgres are the log's,
// and the kicked member's device, sync and history hold nothing past the
// kick.
func TestMoveProjectsInSeqOrder(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir(), "--projection=false")
	if dev.EP.Dedicated == 0 {
		t.Fatal("chatpipe dev has no dedicated vshards")
	}
	ep := filepath.Join(dev.Dir, "endpoints.json")
	hold := filepath.Join(dev.Dir, "projection-hold")
	env := []string{"CHATPIPE_FAULT_PROJECTION_HOLD=" + hold}
	stacktest.StartProc(t, dev.Dir, "projection-a", env, "projection", "--endpoints", ep, "--log-level", "warn")
	waitGroupMembers(t, dev.EP, 1)
	stacktest.StartProc(t, dev.Dir, "projection-b", env, "projection", "--endpoints", ep, "--log-level", "warn")
	assigned := waitGroupMembers(t, dev.EP, 2)

	// A conversation whose hashed partition one member has and whose
	// dedicated vshard's partition the other has.
	l := logrecord.Layout{VShards: dev.EP.VShards, Partitions: dev.EP.Partitions, Dedicated: dev.EP.Dedicated}
	conv, to := "", -1
	for d := dev.EP.VShards; d < dev.EP.All() && conv == ""; d++ {
		newPart := l.Partition(d)
		for i := 0; i < 1000; i++ {
			c := fmt.Sprintf("mpo-%d", i)
			oldPart := l.Partition(logrecord.VShard(c, dev.EP.VShards))
			if assigned[oldPart] != assigned[newPart] {
				conv, to = c, d
				break
			}
		}
	}
	if conv == "" {
		t.Fatalf("no conversation and dedicated vshard on partitions of two projection members (assignment %v)", assigned)
	}
	oldPart, newPart := l.Partition(logrecord.VShard(conv, dev.EP.VShards)), l.Partition(to)
	t.Logf("%s: partition %d (projection member %s) → vshard %d, partition %d (member %s)", conv, oldPart, assigned[oldPart], to, newPart, assigned[newPart])

	owner := newDevice(t, dev, "mpo-owner", "owner")
	kicked := newDevice(t, dev, "mpo-kicked", "kicked")
	for _, d := range []*device{owner, kicked} {
		if err := d.connect(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.disconnect)
	}
	must := func(req map[string]any) int64 {
		t.Helper()
		f, err := owner.doRetrying(req)
		if err != nil || f.Op != protocol.OpAccepted {
			t.Fatalf("%v: %+v %v", req, f, err)
		}
		return f.Seq
	}
	must(map[string]any{"op": "create", "conversation_id": conv, "members": []string{}})
	waitProjected(t, dev.EP, len(readLog(t, dev.EP)))

	// From here the member that has the old partition applies nothing of it.
	if err := os.WriteFile(hold, []byte(strconv.Itoa(int(oldPart))), 0o644); err != nil {
		t.Fatal(err)
	}
	joined := must(map[string]any{"op": "join", "conversation_id": conv, "user_id": "mpo-kicked", "client_message_id": "join"})
	adminCmd(t, dev, "isolate", "--vshard", strconv.Itoa(to), conv)
	kick := must(map[string]any{"op": "kick", "conversation_id": conv, "user_id": "mpo-kicked", "client_message_id": "kick"})
	after := must(map[string]any{"op": "send", "conversation_id": conv, "client_message_id": "after-kick", "body": "not for the kicked"})
	if kick != joined+2 || after != kick+1 {
		t.Fatalf("%s: join at %d, kick at %d, send at %d; want the moved record between join and kick", conv, joined, kick, after)
	}

	// The kick and the send after it are projected while the join's
	// partition is not.
	db, err := pgx.Connect(context.Background(), dev.EP.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	projectedTo := func() int64 {
		var last int64
		if err := db.QueryRow(context.Background(), `SELECT coalesce((SELECT last_seq FROM conversations WHERE conversation_id = $1), 0)`, conv).Scan(&last); err != nil {
			t.Fatal(err)
		}
		return last
	}
	stacktest.WaitForOr(t, 30*time.Second, fmt.Sprintf("%s projected to seq %d (the send after the kick) from partition %d", conv, after, newPart),
		func() bool { return projectedTo() >= after }, func() string { return storedOffsets(dev.EP) })
	persisted, _, err := logsink.Offset(context.Background(), db, logsink.PersistConsumer, dev.EP.Topic, oldPart)
	if err != nil {
		t.Fatal(err)
	}
	projected, _, err := logsink.Offset(context.Background(), db, "projection", dev.EP.Topic, oldPart)
	if err != nil {
		t.Fatal(err)
	}
	if projected >= persisted {
		t.Fatalf("partition %d is projected to offset %d, persist stored it to %d: the join at seq %d was not held back", oldPart, projected, persisted, joined)
	}
	if grepLines(filepath.Join(dev.Dir, "projection-a.log"), "PLANTED FAULT")+grepLines(filepath.Join(dev.Dir, "projection-b.log"), "PLANTED FAULT") == "" {
		t.Fatal("no projection member logged holding back a batch")
	}

	// The old partition's tail now applies after the new one's.
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	last := must(map[string]any{"op": "send", "conversation_id": conv, "client_message_id": "later", "body": "still not for the kicked"})
	rows := readLog(t, dev.EP)
	waitProjected(t, dev.EP, len(rows))
	var mine []row
	for _, r := range rows {
		if r.Conv == conv {
			mine = append(mine, r)
		}
	}
	want := periods(mine)[conv]
	if got := projectedPeriods(t, dev.EP)[conv]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s's membership periods in Postgres differ from the log's:\n got %v\nwant %v", conv, got, want)
	}
	if fmt.Sprint(want["mpo-kicked"]) != fmt.Sprint([][2]int64{{joined, kick}}) {
		t.Errorf("the log's periods of mpo-kicked in %s are %v, want [[%d %d]]", conv, want["mpo-kicked"], joined, kick)
	}

	// What the kicked member reads: pushed, synced and paged back, the
	// events of its period (the kick included) and nothing after.
	stacktest.WaitFor(t, 30*time.Second, fmt.Sprintf("the owner's device to receive %s/%d", conv, last), func() bool { return owner.get(conv, last) != nil })
	if err := kicked.syncAll(); err != nil {
		t.Fatal(err)
	}
	hist, err := kicked.history(conv, 50)
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs := []int64{}
	for s := joined; s <= kick; s++ {
		wantSeqs = append(wantSeqs, s)
	}
	if !slices.Equal(hist, wantSeqs) {
		t.Errorf("history of %s as mpo-kicked: seqs %v, want %v (join through kick)", conv, hist, wantSeqs)
	}
	if got := kicked.seqs(conv); !slices.Equal(got, wantSeqs) {
		t.Errorf("mpo-kicked's device (pushed and synced) holds %s seqs %v, want %v (join through kick)", conv, got, wantSeqs)
	}
	f, err := kicked.doRetrying(map[string]any{"op": "send", "conversation_id": conv, "client_message_id": "kicked-send", "body": "x"})
	if err != nil || f.Code != string(protocol.CodeForbidden) {
		t.Errorf("a send of mpo-kicked to %s after the kick answered %+v %v, want forbidden", conv, f, err)
	}
}

// waitGroupMembers waits until the projection's consumer group has n
// members whose assignments cover every partition of the log, and returns
// which member has each partition.
func waitGroupMembers(t *testing.T, ep endpoints, n int) map[int32]string {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(ep.Kafka...)}, ep.KafkaOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	parts := ep.Partitions + ep.Dedicated
	var got map[int32]string
	var state string
	stacktest.WaitForOr(t, 60*time.Second, fmt.Sprintf("%d projection members sharing the log's %d partitions", n, parts), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gs, err := adm.DescribeGroups(ctx, "chatpipe-projection")
		if err != nil {
			state = err.Error()
			return false
		}
		g := gs["chatpipe-projection"]
		state = fmt.Sprintf("group state %s, %d members", g.State, len(g.Members))
		if g.State != "Stable" || len(g.Members) != n {
			return false
		}
		got = map[int32]string{}
		for _, m := range g.Members {
			a, ok := m.Assigned.AsConsumer()
			if !ok {
				return false
			}
			for _, tp := range a.Topics {
				for _, p := range tp.Partitions {
					got[p] = m.MemberID
				}
			}
		}
		state += fmt.Sprintf(", assigned %v", got)
		return len(got) == parts
	}, func() string { return state })
	return got
}
