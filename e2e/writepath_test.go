package e2e

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

const (
	nUsers   = 50
	nConvs   = 100
	nPerUser = 200
	convSize = 5
)

func userName(i int) string { return fmt.Sprintf("u%d", i%nUsers) }
func convName(k int) string { return fmt.Sprintf("c%d", k) }

// TestWritePath drives 50 clients × 200 messages over 100 conversations
// through a real `chatpipe dev` (kfake, embedded etcd, Postgres, 2 workers),
// with concurrent and post-reconnect retries, then checks the world.
func TestWritePath(t *testing.T) {
	sharing(t, 70, 9)
	// Rate limits off: this test measures the write path (the limits have
	// their own tests in hostile_test.go).
	dev := startDev(t, t.TempDir(), "--workers", "2", "--rate-user", "-1", "--rate-conv", "-1")

	// conversation k: owner u(k), members u(k)..u(k+4)
	owners := make([]*client, nUsers)
	for i := range owners {
		owners[i] = dev.Dial(t, userName(i))
	}
	memberOf := map[string][]string{}
	for k := 0; k < nConvs; k++ {
		var members []string
		for j := 1; j < convSize; j++ {
			members = append(members, userName(k+j))
		}
		r := owners[k%nUsers].Must(map[string]any{"op": "create", "conversation_id": convName(k), "members": members})
		if r.Seq != 1 {
			t.Fatalf("create %s: seq %d", convName(k), r.Seq)
		}
		for j := 0; j < convSize; j++ {
			memberOf[userName(k+j)] = append(memberOf[userName(k+j)], convName(k))
		}
	}

	var mu sync.Mutex
	var accepted []acceptedMsg
	record := func(conv, cmid, user string, r *protocol.Reply, sent, at time.Time) {
		mu.Lock()
		accepted = append(accepted, acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: user, Seq: r.Seq, SentAt: sent, AcceptedAt: at})
		mu.Unlock()
	}
	start := time.Now()
	var latMu sync.Mutex
	var lats []time.Duration
	var wg sync.WaitGroup
	for u := 0; u < nUsers; u++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := userName(u)
			cl := owners[u]
			convs := memberOf[user]
			rng := rand.New(rand.NewPCG(uint64(u), 7))
			const inflight = 8
			sem := make(chan struct{}, inflight)
			var cwg sync.WaitGroup
			for i := 0; i < nPerUser; i++ {
				conv := convs[i%len(convs)]
				cmid := fmt.Sprintf("%s-m%d", user, i)
				body := fmt.Sprintf("hello %d from %s", i, user)
				if i%50 == 49 {
					// reconnect, then retry an earlier message with the same id
					cwg.Wait()
					cl.Close()
					cl = dev.Dial(t, user)
					prev := i - 1 - rng.IntN(10)
					pconv, pcmid := convs[prev%len(convs)], fmt.Sprintf("%s-m%d", user, prev)
					r, err := cl.SendRetrying(pconv, pcmid, "changed body is ignored")
					if err != nil || r.Op != protocol.OpAccepted {
						t.Errorf("retry after reconnect of %s: %+v %v", pcmid, r, err)
					} else {
						mu.Lock()
						for _, a := range accepted {
							if a.Conv == pconv && a.ClientMessageID == pcmid && (a.Seq != r.Seq || a.MessageID != r.MessageID) {
								t.Errorf("retry of %s after reconnect: seq %d/%s, first %d/%s", pcmid, r.Seq, r.MessageID, a.Seq, a.MessageID)
							}
						}
						mu.Unlock()
					}
				}
				sem <- struct{}{}
				cwg.Add(1)
				go func(cl *client) {
					defer cwg.Done()
					defer func() { <-sem }()
					sent := time.Now()
					if i%10 == 3 {
						// the same send twice at once: one message, one answer
						var r1, r2 *protocol.Reply
						var e1, e2 error
						var dwg sync.WaitGroup
						dwg.Add(2)
						go func() { defer dwg.Done(); r1, e1 = cl.SendRetrying(conv, cmid, body) }()
						go func() { defer dwg.Done(); r2, e2 = cl.SendRetrying(conv, cmid, body) }()
						dwg.Wait()
						at := time.Now()
						if e1 != nil || e2 != nil || r1.Op != protocol.OpAccepted || r2.Op != protocol.OpAccepted {
							t.Errorf("concurrent duplicate %s: %+v %+v %v %v", cmid, r1, r2, e1, e2)
							return
						}
						if r1.Seq != r2.Seq || r1.MessageID != r2.MessageID {
							t.Errorf("concurrent duplicate %s got two results: %d/%s and %d/%s", cmid, r1.Seq, r1.MessageID, r2.Seq, r2.MessageID)
						}
						record(conv, cmid, user, r1, sent, at)
						return
					}
					r, err := cl.SendRetrying(conv, cmid, body)
					at := time.Now()
					if err != nil || r.Op != protocol.OpAccepted {
						t.Errorf("send %s: %+v %v", cmid, r, err)
						return
					}
					latMu.Lock()
					lats = append(lats, at.Sub(sent))
					latMu.Unlock()
					record(conv, cmid, user, r, sent, at)
				}(cl)
			}
			cwg.Wait()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d sends accepted in %v: %.0f msg/s; accepted latency %s", len(accepted), elapsed.Round(time.Millisecond),
		float64(len(accepted))/elapsed.Seconds(), percentiles(lats))
	if len(accepted) != nUsers*nPerUser {
		t.Fatalf("accepted %d of %d", len(accepted), nUsers*nPerUser)
	}

	// Membership: outsiders and kicked users get forbidden, nothing is written.
	outsider := dev.Dial(t, "outsider")
	if r, _ := outsider.Do(map[string]any{"op": "send", "conversation_id": "c0", "client_message_id": "x1", "body": "hi"}); r == nil || r.Code != protocol.CodeForbidden {
		t.Errorf("outsider send: %+v", r)
	}
	owner1 := dev.Dial(t, userName(1))
	owner1.Must(map[string]any{"op": "kick", "conversation_id": "c1", "user_id": userName(2)})
	kicked := dev.Dial(t, userName(2))
	if r, _ := kicked.Do(map[string]any{"op": "send", "conversation_id": "c1", "client_message_id": "after-kick", "body": "hi"}); r == nil || r.Code != protocol.CodeForbidden {
		t.Errorf("kicked send: %+v", r)
	}
	// a retry of a message accepted before the kick still gets its first answer
	var before acceptedMsg
	for _, a := range accepted {
		if a.Conv == "c1" && a.Sender == userName(2) {
			before = a
			break
		}
	}
	if r, _ := kicked.Do(map[string]any{"op": "send", "conversation_id": "c1", "client_message_id": before.ClientMessageID, "body": "x"}); r == nil || r.Seq != before.Seq || r.MessageID != before.MessageID {
		t.Errorf("retry of a pre-kick message: %+v, first %+v", r, before)
	}
	// another sender reusing someone's client_message_id: conflict
	if r, _ := owner1.Do(map[string]any{"op": "send", "conversation_id": "c1", "client_message_id": before.ClientMessageID, "body": "x"}); r == nil || r.Code != protocol.CodeConflict {
		t.Errorf("reused client_message_id: %+v", r)
	}

	checkWorld(t, dev.EP, accepted)
}

func percentiles(d []time.Duration) string {
	if len(d) == 0 {
		return "n/a"
	}
	s := append([]time.Duration(nil), d...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return fmt.Sprintf("p50 %v p99 %v", s[len(s)/2].Round(time.Microsecond), s[len(s)*99/100].Round(time.Microsecond))
}
