package shardworker

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/logrecord"
)

// TestLoaderMergesLoads: loads queued together are answered by a few
// shared round trips, and each gets exactly what fetchState gives it
// alone: its conversations (a new state for one with no events) and the
// keys it asked for that Postgres holds, nothing of the other loads.
func TestLoaderMergesLoads(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	const n = 60
	for i := range n {
		if _, err := db.Exec(ctx, `INSERT INTO events (conversation_id, seq, kind, message_id, sender, members, client_message_id, created_at, vshard, epoch, log_partition, log_offset)
			VALUES ($1, 1, 'create', $2, 'u1', '{u1,u2}', NULL, now(), 0, 1, 0, $3), ($1, 2, 'message', $4, 'u2', NULL, 'k1', now(), 0, 1, 0, $5)`,
			fmt.Sprintf("c%d", i), fmt.Sprintf("m%d-1", i), 2*i, fmt.Sprintf("m%d-2", i), 2*i+1); err != nil {
			t.Fatal(err)
		}
	}
	var trips, loads atomic.Int64
	l := newLoader(db, 10*time.Second, &trips, &loads)
	type want struct {
		convs map[string]*shardcore.Conv
		found map[shardcore.DedupeKey]shardcore.First
	}
	reqs := make([][2]any, n)
	wants := make([]want, n)
	for i := range n {
		convs := []string{fmt.Sprintf("c%d", i), fmt.Sprintf("new%d", i)} // one with events, one without
		keys := []shardcore.DedupeKey{{Conv: fmt.Sprintf("c%d", i), CMID: "k1"}, {Conv: fmt.Sprintf("c%d", i), CMID: "k-missing"}}
		c, f, err := fetchState(ctx, db, convs, keys)
		if err != nil {
			t.Fatal(err)
		}
		reqs[i], wants[i] = [2]any{convs, keys}, want{c, f}
	}
	// Every round trip slot is taken (one, held by the test), so the loads
	// queue; ending the held round trip answers all of them together.
	l.maxTrips, l.inflight = 1, 1
	got := make([]want, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, f, err := l.load(ctx, reqs[i][0].([]string), reqs[i][1].([]shardcore.DedupeKey))
			if err != nil {
				t.Error(err)
			}
			got[i] = want{c, f}
		}()
	}
	for {
		l.mu.Lock()
		queued := len(l.queue)
		l.mu.Unlock()
		if queued == n {
			break
		}
		time.Sleep(time.Millisecond)
	}
	l.finish()
	wg.Wait()
	for i := range n {
		if !reflect.DeepEqual(got[i], wants[i]) {
			t.Fatalf("load %d got %+v, want what fetchState gives it alone: %+v", i, got[i], wants[i])
		}
	}
	if loads.Load() != n || trips.Load() != 1 {
		t.Fatalf("%d loads in %d round trips, want %d loads in 1", loads.Load(), trips.Load(), n)
	}
	// With a slot free, a load makes its own round trip at once.
	if _, _, err := l.load(ctx, []string{"c0"}, nil); err != nil || trips.Load() != 2 {
		t.Fatalf("a load with a free slot: %v, %d round trips, want its own (2)", err, trips.Load())
	}
	// A stopped loader answers at once.
	l.stop()
	if _, _, err := l.load(ctx, []string{"c0"}, nil); err != errLoaderStopped {
		t.Fatalf("load after the loader stopped: %v, want errLoaderStopped", err)
	}
}

// TestLoaderMergedLoadsOfOneConversation: an overridden conversation may
// be loaded by two writers at once (its hashed vshard's and a dedicated
// one's). Merged into one round trip, each load still gets a state of its
// own, equal to what fetchState gives it alone: a writer that applies its
// events must not change the other writer's state.
func TestLoaderMergedLoadsOfOneConversation(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	if _, err := db.Exec(ctx, `INSERT INTO events (conversation_id, seq, kind, message_id, sender, members, user_id, client_message_id, created_at, vshard, epoch, log_partition, log_offset)
		VALUES ('c', 1, 'create', 'm1', 'u1', '{u1,u2}', NULL, 'k0', now(), 0, 1, 0, 0),
		       ('c', 2, 'join', 'm2', 'u1', NULL, 'u3', 'k1', now(), 0, 1, 0, 1),
		       ('c', 3, 'message', 'm3', 'u2', NULL, NULL, 'k2', now(), 0, 1, 0, 2)`); err != nil {
		t.Fatal(err)
	}
	alone, aloneFound, err := fetchState(ctx, db, []string{"c"}, []shardcore.DedupeKey{{Conv: "c", CMID: "k2"}})
	if err != nil {
		t.Fatal(err)
	}
	var trips, loads atomic.Int64
	l := newLoader(db, 10*time.Second, &trips, &loads)
	l.maxTrips, l.inflight = 1, 1 // the slot is held: both loads queue and merge
	type res struct {
		convs map[string]*shardcore.Conv
		found map[shardcore.DedupeKey]shardcore.First
	}
	got := make([]res, 2)
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, f, err := l.load(ctx, []string{"c"}, []shardcore.DedupeKey{{Conv: "c", CMID: "k2"}})
			if err != nil {
				t.Error(err)
			}
			got[i] = res{c, f}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		queued := len(l.queue)
		l.mu.Unlock()
		if queued == len(got) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d loads of conversation c queued after 10 s", queued, len(got))
		}
		time.Sleep(time.Millisecond)
	}
	l.finish()
	wg.Wait()
	if trips.Load() != 1 {
		t.Fatalf("%d round trips, want the two loads merged into 1", trips.Load())
	}
	for i, g := range got {
		if !reflect.DeepEqual(g.convs["c"], alone["c"]) || !reflect.DeepEqual(g.found, aloneFound) {
			t.Fatalf("merged load %d of conversation c got %+v %+v, want what fetchState gives it alone: %+v %+v", i, g.convs["c"], g.found, alone["c"], aloneFound)
		}
	}
	a, b := got[0].convs["c"], got[1].convs["c"]
	if a == b {
		t.Fatal("both writers were handed the same *Conv of conversation c")
	}
	// One writer deciding on its state leaves the other's as loaded.
	shardcore.Apply(a, &logrecord.Event{Kind: logrecord.KindKick, ConversationID: "c", Seq: 4, Sender: "u1", UserID: "u3"})
	if !reflect.DeepEqual(b, alone["c"]) {
		t.Fatalf("applying a kick to one writer's state of c changed the other's: %+v, want %+v", b, alone["c"])
	}
}
