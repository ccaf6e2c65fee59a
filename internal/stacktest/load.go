package stacktest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

// Accepted is one send the stack accepted, as its sender saw it.
type Accepted struct {
	Conv, ClientMessageID, MessageID, Sender string
	Seq                                      int64
	SentAt, AcceptedAt                       time.Time
	// AttemptAt is when the attempt that was accepted was sent (SentAt
	// if the first was, a retry's time if not), where the sender knows it
	// (Client.SendAccepted).
	AttemptAt time.Time
}

// Load keeps users sending to shared conversations until stopped,
// recording every accepted send.
type Load struct {
	t        testing.TB
	mu       sync.Mutex
	accepted []Accepted
	stop     chan struct{}
	halted   sync.Once
	wg       sync.WaitGroup
}

// NewLoad returns a load with nothing sending yet. Its senders (Go) stop
// and are waited for when the test ends, however it ends: the first
// clean-up (registered here, so it runs last) waits for them, the second
// (register it with StopOnCleanup after the senders' connections, so it
// runs before they close) stops them, and a sender whose send fails after
// the stop should say nothing (Stopped). A test that fails half-way leaves
// no sender behind to report into a test that is over.
func NewLoad(t testing.TB) *Load {
	l := &Load{t: t, stop: make(chan struct{})}
	t.Cleanup(l.wg.Wait)
	return l
}

// Go runs sender in a goroutine that Finish and the test's end wait for.
func (l *Load) Go(sender func()) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		sender()
	}()
}

// Record adds an accepted send.
func (l *Load) Record(a Accepted) {
	l.mu.Lock()
	l.accepted = append(l.accepted, a)
	l.mu.Unlock()
}

// StopOnCleanup registers the clean-up that stops the senders.
func (l *Load) StopOnCleanup() { l.t.Cleanup(l.Halt) }

// Halt tells the senders to stop; safe more than once.
func (l *Load) Halt() { l.halted.Do(func() { close(l.stop) }) }

// Stopped says whether Halt was called.
func (l *Load) Stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// CreateLoadConversations creates conversations lc0..lc<convs-1>, owned by
// lu0 with lu1..lu<users-1> as members, retrying while they are
// unavailable.
func CreateLoadConversations(t testing.TB, dev *Dev, users, convs int) {
	t.Helper()
	owner := dev.Dial(t, "lu0")
	var members []string
	for u := 1; u < users; u++ {
		members = append(members, fmt.Sprintf("lu%d", u))
	}
	for c := 0; c < convs; c++ {
		r, err := owner.Do(map[string]any{"op": "create", "conversation_id": fmt.Sprintf("lc%d", c), "members": members})
		for start := time.Now(); err == nil && r.Code == protocol.CodeUnavailable && time.Since(start) < time.Minute; {
			time.Sleep(200 * time.Millisecond)
			r, err = owner.Do(map[string]any{"op": "create", "conversation_id": fmt.Sprintf("lc%d", c), "members": members})
		}
		if err != nil || (r.Op != protocol.OpAccepted && r.Code != protocol.CodeConflict) {
			t.Fatalf("create lc%d: %+v %v", c, r, err)
		}
	}
}

// StartLoad creates the load's conversations (CreateLoadConversations)
// and has users lu0..lu<users-1> send to them in turn, each on its own
// websocket, as fast as they are answered.
func StartLoad(t testing.TB, dev *Dev, users, convs int) *Load {
	t.Helper()
	l := NewLoad(t)
	CreateLoadConversations(t, dev, users, convs)
	for u := 0; u < users; u++ {
		user := fmt.Sprintf("lu%d", u)
		cl := dev.Dial(t, user)
		l.Go(func() {
			for i := 0; !l.Stopped(); i++ {
				conv, cmid := fmt.Sprintf("lc%d", (i+u)%convs), fmt.Sprintf("%s-%d", user, i)
				a, err := cl.SendAccepted(conv, cmid, "load")
				if err != nil {
					if !l.Stopped() {
						t.Errorf("load send: %v", err)
					}
					return
				}
				l.Record(a)
			}
		})
	}
	l.StopOnCleanup()
	return l
}

// Count is the number of sends accepted so far.
func (l *Load) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.accepted)
}

// Snapshot is every send accepted so far.
func (l *Load) Snapshot() []Accepted {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Accepted(nil), l.accepted...)
}

// WaitAbove waits until more than n sends are accepted; a timeout says
// how many were and when the last one was.
func (l *Load) WaitAbove(t testing.TB, timeout time.Duration, what string, n int) {
	t.Helper()
	WaitForOr(t, timeout, what, func() bool { return l.Count() > n }, func() string {
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.accepted) == 0 {
			return fmt.Sprintf("want more than %d sends accepted; none was", n)
		}
		last := l.accepted[len(l.accepted)-1]
		return fmt.Sprintf("want more than %d sends accepted; %d were, the last (%s to %s, seq %d) %v ago",
			n, len(l.accepted), last.ClientMessageID, last.Conv, last.Seq, time.Since(last.AcceptedAt).Round(time.Millisecond))
	})
}

// Finish stops the senders, waits for them and returns every accepted
// send.
func (l *Load) Finish() []Accepted {
	l.Halt()
	l.wg.Wait()
	return l.accepted
}
