// The load the fault tests run: users sending to shared conversations, each accepted send recorded.

package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

// loadGen keeps users sending to shared conversations until stopped,
// recording every accepted send.
type loadGen struct {
	t        *testing.T
	mu       sync.Mutex
	accepted []acceptedMsg
	stop     chan struct{}
	halted   sync.Once
	wg       sync.WaitGroup
}

// newLoadGen returns a load with nothing sending yet. Its senders stop and
// are waited for when the test ends, however it ends: the first clean-up
// (registered here, so it runs last) waits for them, the second (register
// it with stopOnCleanup after the senders' connections, so it runs before
// they close) stops them, and a sender whose send fails after the stop
// says nothing. A test that fails half-way leaves no sender behind to
// report into a test that is over.
func newLoadGen(t *testing.T) *loadGen {
	l := &loadGen{t: t, stop: make(chan struct{})}
	t.Cleanup(l.wg.Wait)
	return l
}

// stopOnCleanup registers the clean-up that stops the senders.
func (l *loadGen) stopOnCleanup() { l.t.Cleanup(l.halt) }

// halt tells the senders to stop; safe more than once.
func (l *loadGen) halt() { l.halted.Do(func() { close(l.stop) }) }

// stopped says whether halt was called.
func (l *loadGen) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// createLoadConversations creates conversations lc0..lc<convs-1>, owned by
// lu0 with lu1..lu<users-1> as members, retrying while they are
// unavailable.
func createLoadConversations(t *testing.T, dev *devProc, users, convs int) {
	t.Helper()
	owner := dev.dial(t, "lu0")
	var members []string
	for u := 1; u < users; u++ {
		members = append(members, fmt.Sprintf("lu%d", u))
	}
	for c := 0; c < convs; c++ {
		r, err := owner.do(map[string]any{"op": "create", "conversation_id": fmt.Sprintf("lc%d", c), "members": members})
		for start := time.Now(); err == nil && r.Code == protocol.CodeUnavailable && time.Since(start) < time.Minute; {
			time.Sleep(200 * time.Millisecond)
			r, err = owner.do(map[string]any{"op": "create", "conversation_id": fmt.Sprintf("lc%d", c), "members": members})
		}
		if err != nil || (r.Op != protocol.OpAccepted && r.Code != protocol.CodeConflict) {
			t.Fatalf("create lc%d: %+v %v", c, r, err)
		}
	}
}

func startLoad(t *testing.T, dev *devProc, users, convs int) *loadGen {
	t.Helper()
	l := newLoadGen(t)
	createLoadConversations(t, dev, users, convs)
	for u := 0; u < users; u++ {
		user := fmt.Sprintf("lu%d", u)
		cl := dev.dial(t, user)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; !l.stopped(); i++ {
				conv, cmid := fmt.Sprintf("lc%d", (i+u)%convs), fmt.Sprintf("%s-%d", user, i)
				sent := time.Now()
				r, err := cl.sendRetrying(conv, cmid, "load")
				if err != nil || r.Op != protocol.OpAccepted {
					if !l.stopped() {
						t.Errorf("load send %s: %+v %v", cmid, r, err)
					}
					return
				}
				l.mu.Lock()
				l.accepted = append(l.accepted, acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: user, Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
				l.mu.Unlock()
			}
		}()
	}
	l.stopOnCleanup()
	return l
}

func (l *loadGen) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.accepted)
}

// waitAbove waits until more than n sends are accepted; a timeout says
// how many were and when the last one was.
func (l *loadGen) waitAbove(t *testing.T, timeout time.Duration, what string, n int) {
	t.Helper()
	waitForOr(t, timeout, what, func() bool { return l.count() > n }, func() string {
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

func (l *loadGen) finish() []acceptedMsg {
	l.halt()
	l.wg.Wait()
	return l.accepted
}

// underLoad starts load on dev, runs fault after some sends were accepted,
// keeps the load going until more were accepted after the fault, and
// checks the world.
func underLoad(t *testing.T, dev *devProc, fault func()) {
	t.Helper()
	load := startLoad(t, dev, 10, 20)
	load.waitAbove(t, 60*time.Second, "load to flow", 200)
	fault()
	n := load.count()
	load.waitAbove(t, 120*time.Second, "load to go on after the fault", n+300)
	accepted := load.finish()
	t.Logf("%d sends accepted", len(accepted))
	checkWorld(t, dev.ep, accepted)
}
