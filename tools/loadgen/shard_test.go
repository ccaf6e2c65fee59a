package loadgen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/atomicfile"
)

func TestShardsAreDisjointAndCoverThePlan(t *testing.T) {
	p := Profiles["peak"]
	s := Shape{Users: 301, Conversations: 2000}
	const n = 3
	users, convs := map[string]int{}, map[string]int{}
	for k := 1; k <= n; k++ {
		part, err := ShardPlan("r", s, p, 7, Shard{k, n})
		if err != nil {
			t.Fatal(err)
		}
		again, _ := ShardPlan("r", s, p, 7, Shard{k, n})
		if strings.Join(part.Users, ",") != strings.Join(again.Users, ",") || len(part.Conversations) != len(again.Conversations) {
			t.Fatal("the same seed made different shards")
		}
		mine := map[string]bool{}
		for _, u := range part.Users {
			users[u]++
			mine[u] = true
		}
		for i, c := range part.Conversations {
			convs[c.ID]++
			if strings.Join(c.Members, ",") != strings.Join(again.Conversations[i].Members, ",") {
				t.Fatal("the same seed made different members")
			}
			for _, m := range c.Members {
				if !mine[m] {
					t.Fatalf("shard %d: %s has member %s of another shard", k, c.ID, m)
				}
			}
		}
	}
	// Users rounded up to a multiple of 3: 303.
	if len(users) != 303 || len(convs) != 2000 {
		t.Fatalf("shards cover %d users, %d conversations", len(users), len(convs))
	}
	for u, c := range users {
		if c != 1 {
			t.Fatalf("user %s in %d shards", u, c)
		}
	}
	for id, c := range convs {
		if c != 1 {
			t.Fatalf("conversation %s in %d shards", id, c)
		}
	}
	// The whole plan is NewPlan's.
	whole, _ := ShardPlan("r", s, p, 7, Shard{})
	if plain := NewPlan("r", s, p, 7); strings.Join(whole.Conversations[5].Members, ",") != strings.Join(plain.Conversations[5].Members, ",") {
		t.Error("the unsharded plan changed")
	}
	if _, err := ShardPlan("h", Shape{Users: 20, Conversations: 1}, Profiles["hot"], 1, Shard{1, 2}); err == nil {
		t.Error("one conversation split into 2 shards")
	}
	for _, bad := range []string{"0/2", "3/2", "1/0", "x", "1/2/3"} {
		if _, err := ParseShard(bad); err == nil {
			t.Errorf("shard %q parsed", bad)
		}
	}
	if sh, err := ParseShard("2/3"); err != nil || sh != (Shard{2, 3}) {
		t.Errorf("2/3: %v %v", sh, err)
	}
}

func TestMergeLatency(t *testing.T) {
	a, b, all := newLatency(), newLatency(), newLatency()
	for i := 1; i <= 1000; i++ {
		d := time.Duration(i) * time.Millisecond
		if i%3 == 0 {
			a.record(d)
		} else {
			b.record(10 * d)
		}
		all.record(map[bool]time.Duration{true: d, false: 10 * d}[i%3 == 0])
	}
	got, err := MergeLatency(a.summary(), b.summary(), Latency{})
	if err != nil {
		t.Fatal(err)
	}
	want := all.summary()
	if got.Count != 1000 || got.P50MS != want.P50MS || got.P99MS != want.P99MS || got.MaxMS != want.MaxMS || got.MeanMS != want.MeanMS {
		t.Fatalf("merged %+v, want %+v", got, want)
	}
	if _, err := MergeLatency(Latency{Count: 1}); err == nil {
		t.Error("a summary without its histogram merged")
	}
}

// shardDir writes a finished shard's run directory.
func shardDir(t *testing.T, out string, k int, start time.Time, status string) string {
	dir := filepath.Join(out, "r-"+string(rune('0'+k))+"of2")
	os.MkdirAll(dir, 0o755)
	plan, err := ShardPlan("r", Shape{Users: 20, Conversations: 40}, Profiles["peak"], 1, Shard{k, 2})
	if err != nil {
		t.Fatal(err)
	}
	info := RunInfo{Run: "r", Shard: Shard{k, 2}.String(), Rate: 50, Duration: "2s", Start: start, Plan: plan,
		Stack: Stack{WebSocket: "ws://gw" + string(rune('0'+k)), Kafka: []string{"k:9092"}, Topic: "t", Postgres: "pg"}}
	atomicfile.WriteJSON(filepath.Join(dir, RunFile), info, 0o644)
	c := Counters{SendStart: start.UnixNano(), SendEnd: start.Add(2 * time.Second).UnixNano(), Offered: 100, Sent: 100,
		Commands: 120, Resends: 6, SentPerSec: []int64{50, 50}, Retries: map[string]int64{"timeout": 6}}
	atomicfile.WriteJSON(filepath.Join(dir, CountersFile), c, 0o644)
	lat := newLatency()
	conv := plan.Conversations[0]
	for i := 0; i < 100; i++ {
		due := start.Add(time.Duration(i) * 20 * time.Millisecond)
		l := time.Duration(k) * 10 * time.Millisecond
		lat.record(l)
		writeLines(t, filepath.Join(dir, AcceptedFile), Accepted{Op: "send", Conv: conv.ID, Seq: int64(i + 2), ClientMessageID: "m",
			Sender: conv.Owner, Due: due.UnixNano(), Sent: due.UnixNano(), At: due.Add(l).UnixNano()})
	}
	dl := newLatency()
	dl.record(time.Duration(k) * time.Second)
	writeLines(t, filepath.Join(dir, DeliveredFile), Delivered{Device: conv.Owner + "/0", Conv: conv.ID, Seq: 2})
	rep := &Report{Run: "r", Shard: info.Shard, Status: status, Phase: map[bool]string{true: "", false: "converge"}[status == StatusFinished],
		Start: start, End: start.Add(5 * time.Second), AcceptedLat: lat.summary(), DeliveryLat: dl.summary(), DeliveryMode: "served"}
	if err := WriteReport(dir, rep); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestMergeShards(t *testing.T) {
	out := t.TempDir()
	start := time.Unix(1700000000, 0)
	a := shardDir(t, out, 1, start, StatusFinished)
	b := shardDir(t, out, 2, start.Add(time.Second), StatusFinished)
	merged := filepath.Join(out, "r")
	rep, err := Merge(merged, []string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	run, err := ReadRun(merged)
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Accepted) != 200 || len(run.Delivered) != 2 || len(run.Info.Plan.Users) != 20 || len(run.Info.Plan.Conversations) != 40 {
		t.Fatalf("merged %d accepted, %d delivered, %d users, %d conversations", len(run.Accepted), len(run.Delivered), len(run.Info.Plan.Users), len(run.Info.Plan.Conversations))
	}
	if rep.Status != StatusFinished || rep.Rate != 100 || rep.Offered != 200 || rep.Sent != 200 || rep.Accepted != 200 || rep.Resends != 12 || rep.Retries["timeout"] != 12 {
		t.Fatalf("report %+v", rep)
	}
	// Shard 2 started a second later: its first sends land in seconds 2,
	// 3; its last answer in second 4.
	if len(rep.Timeline) != 4 || rep.Timeline[3].Accepted != 1 || rep.Timeline[0].Sent != 50 || rep.Timeline[1].Sent != 100 || rep.Timeline[2].Sent != 50 {
		t.Fatalf("timeline %+v", rep.Timeline)
	}
	if rep.AcceptedLat.Count != 200 || rep.AcceptedLat.P50MS > 10.1 || rep.AcceptedLat.MaxMS < 19.9 {
		t.Errorf("accepted latency %+v", rep.AcceptedLat)
	}
	if rep.DeliveryLat.Count != 2 || rep.DeliveryLat.MaxMS < 1999 {
		t.Errorf("delivery latency %+v", rep.DeliveryLat)
	}
	if run.Info.Stack.Postgres != "pg" || len(run.Info.Parts) != 2 {
		t.Errorf("info %+v", run.Info)
	}
	// Merging again into a non-empty directory, or one run twice, fails.
	if _, err := Merge(merged, []string{a, b}); err == nil {
		t.Error("merged into a non-empty directory")
	}
	if _, err := Merge(filepath.Join(out, "twice"), []string{a, a}); err == nil {
		t.Error("merged a run with itself")
	}
	// A failed part makes the merged run failed.
	c := shardDir(t, t.TempDir(), 2, start, StatusFailed)
	rep, err = Merge(filepath.Join(out, "failed"), []string{a, c})
	if err != nil || rep.Status != StatusFailed || !strings.Contains(rep.Error, "converge") {
		t.Fatalf("merge with a failed part: %v %+v", err, rep)
	}
}
