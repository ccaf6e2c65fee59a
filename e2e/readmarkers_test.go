package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	chatclient "github.com/chatpipe/chatpipe/client"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// markerLog is what one device's OnRead saw, in order.
type markerLog struct {
	mu   sync.Mutex
	seqs map[string][]int64
}

func (m *markerLog) add(conv string, seq int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seqs == nil {
		m.seqs = map[string][]int64{}
	}
	m.seqs[conv] = append(m.seqs[conv], seq)
}

func (m *markerLog) of(conv string) []int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.seqs[conv])
}

// heard waits until OnRead has told m of conv's marker seq (or a higher
// one) and returns every marker of conv it was told of, in order. The
// client knows a marker (ReadSeq) before its deliverer goroutine calls
// OnRead with it.
func (m *markerLog) heard(t *testing.T, conv string, seq int64) []int64 {
	t.Helper()
	stacktest.WaitFor(t, 30*time.Second, fmt.Sprintf("OnRead of %s's marker %d", conv, seq), func() bool {
		got := m.of(conv)
		return len(got) > 0 && got[len(got)-1] >= seq
	})
	return m.of(conv)
}

// unread is conv's entry of user's conversations list.
func unread(t *testing.T, ctx context.Context, c *chatclient.Client, conv string) protocol.ConversationInfo {
	t.Helper()
	list, err := c.ListConversations(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range list {
		if x.ConversationID == conv {
			return x
		}
	}
	t.Fatalf("%s is not in the conversations list %+v", conv, list)
	return protocol.ConversationInfo{}
}

// Read markers through the whole pipeline: a marker recorded by one device
// reaches the user's other devices (pushed, and by sync to a device that
// connects later), a lower marker never moves it back, and the unread
// counts of conversations are right after bursts from another member.
func TestReadMarkers(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log frameLog
	alice := dialClient(t, dev, dev.EP.WebSocket, "alice", &log, chatclient.Options{})
	var m1, m2 markerLog
	bob1 := dialClient(t, dev, dev.EP.WebSocket, "bob", &log, chatclient.Options{OnRead: m1.add})
	bob2 := dialClient(t, dev, dev.EP.WebSocket, "bob", &log, chatclient.Options{Batch: true, OnRead: m2.add})
	for _, c := range []*chatclient.Client{bob1, bob2} {
		if err := c.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
	}
	const conv = "rm-1"
	createVisible(t, ctx, alice, conv, "bob")
	const burst = 30
	for i := range burst {
		if _, err := alice.Send(ctx, conv, fmt.Sprintf("m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	last := int64(1 + burst)
	stacktest.WaitFor(t, 30*time.Second, "bob's devices to get the burst", func() bool {
		return len(bob1.Messages(conv)) == int(last) && len(bob2.Messages(conv)) == int(last)
	})
	if x := unread(t, ctx, bob1, conv); x.ReadSeq != 0 || x.Unread != burst || x.LastSeq != last {
		t.Fatalf("before any marker: %+v, want read_seq 0, unread %d", x, burst)
	}
	if x := unread(t, ctx, alice, conv); x.Unread != 0 {
		t.Fatalf("alice's own messages count as unread for her: %+v", x)
	}

	// One device marks; the other hears of it.
	if err := bob1.MarkRead(ctx, conv, 11); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, 30*time.Second, "bob's other device to get the marker", func() bool { return bob2.ReadSeq(conv) == 11 })
	stacktest.WaitFor(t, 30*time.Second, "the unread count to drop", func() bool {
		x := unread(t, ctx, bob2, conv)
		return x.ReadSeq == 11 && x.Unread == last-11
	})

	// A lower marker, from a raw connection that does not know the current
	// one, is accepted and changes nothing; a later higher one moves it.
	raw := dev.Dial(t, "bob")
	defer raw.Close()
	if r := raw.Must(map[string]any{"op": "read", "conversation_id": conv, "seq": 5}); r.Seq != 5 || r.MessageID != "" {
		t.Fatalf("lower marker answered %+v", r)
	}
	raw.Must(map[string]any{"op": "read", "conversation_id": conv, "seq": 20})
	stacktest.WaitFor(t, 30*time.Second, "both devices to get marker 20", func() bool { return bob1.ReadSeq(conv) == 20 && bob2.ReadSeq(conv) == 20 })
	for name, m := range map[string]*markerLog{"bob1": &m1, "bob2": &m2} {
		if got := m.heard(t, conv, 20); !slices.Equal(got, []int64{11, 20}) {
			t.Errorf("%s saw markers %v, want [11 20] (a lower marker must never be seen)", name, got)
		}
	}
	if x := unread(t, ctx, bob1, conv); x.ReadSeq != 20 || x.Unread != last-20 {
		t.Fatalf("after the lower marker and marker 20: %+v, want read_seq 20, unread %d", x, last-20)
	}

	// Refused: a stranger, a seq past the end, no seq.
	carol := dev.Dial(t, "carol")
	defer carol.Close()
	for _, c := range []struct {
		cl   *client
		req  map[string]any
		code protocol.Code
	}{
		{carol, map[string]any{"op": "read", "conversation_id": conv, "seq": 3}, protocol.CodeForbidden},
		{raw, map[string]any{"op": "read", "conversation_id": conv, "seq": last + 5}, protocol.CodeBadRequest},
		{raw, map[string]any{"op": "read", "conversation_id": conv}, protocol.CodeBadRequest},
	} {
		r, err := c.cl.Do(c.req)
		if err != nil || r.Code != c.code {
			t.Errorf("%v answered %+v, %v; want %s", c.req, r, err, c.code)
		}
	}

	// Another burst: the count grows from the marker; a device that
	// connects now learns the marker from its first sync.
	const more = 7
	for i := range more {
		if _, err := alice.Send(ctx, conv, fmt.Sprintf("n%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	stacktest.WaitFor(t, 30*time.Second, "the second burst in the read model", func() bool {
		return unread(t, ctx, bob1, conv).LastSeq == last+more
	})
	if x := unread(t, ctx, bob1, conv); x.Unread != last-20+more {
		t.Fatalf("after the second burst: %+v, want unread %d", x, last-20+more)
	}
	var m3 markerLog
	bob3 := dialClient(t, dev, dev.EP.WebSocket, "bob", &log, chatclient.Options{OnRead: m3.add})
	if err := bob3.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if got := bob3.ReadSeq(conv); got != 20 {
		t.Fatalf("a device connecting later knows marker %d, want 20", got)
	}
	// Reading to the end clears the count.
	if err := bob3.MarkRead(ctx, conv, last+more); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, 30*time.Second, "the count to reach 0", func() bool { return unread(t, ctx, bob2, conv).Unread == 0 })
	if got := m2.heard(t, conv, last+more); !slices.Equal(got, []int64{11, 20, last + more}) {
		t.Errorf("bob2 saw markers %v", got)
	}
	log.check(t)
}
