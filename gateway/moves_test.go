package gateway

import (
	"context"
	"testing"
	"time"
)

// A move cancels exactly the calls in flight to the moved vshard's old
// epoch, and the watcher ends once no call is in flight.
func TestMoveWatchCancelsOnlyMovedCalls(t *testing.T) {
	owners := newFakeOwners()
	owners.set(0, "w1", 1)
	owners.set(1, "w1", 1)
	m := newMoveWatch(owners)
	var calls []*moveCall
	var ctxs []context.Context
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c := &moveCall{v: i % 2, epoch: 1, cancel: cancel}
		m.add(c)
		calls, ctxs = append(calls, c), append(ctxs, ctx)
	}
	owners.set(1, "w2", 2)
	for i, c := range calls {
		if i%2 == 1 {
			select {
			case <-ctxs[i].Done():
			case <-time.After(5 * time.Second):
				t.Fatalf("call %d to the moved vshard was not cancelled", i)
			}
			if !c.moved.Load() {
				t.Fatalf("call %d cancelled without moved set", i)
			}
		}
	}
	for i, c := range calls {
		m.remove(c)
		if i%2 == 0 && (ctxs[i].Err() != nil || c.moved.Load()) {
			t.Fatalf("call %d to the unmoved vshard was cancelled", i)
		}
	}
	// A call added at an epoch that has moved already is cancelled at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	late := &moveCall{v: 1, epoch: 1, cancel: cancel}
	m.add(late)
	if ctx.Err() == nil || !late.moved.Load() {
		t.Fatal("a call to an epoch already moved was not cancelled")
	}
	m.remove(late)
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		running := m.running
		m.mu.Unlock()
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watcher still runs with no call in flight")
		}
		time.Sleep(time.Millisecond)
	}
}
