package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestRejectedCodes covers the codes TestBadInput and TestWritePath do not:
// unauthorized (a token that expired on an open connection), rate_limited
// per user and per conversation, not_found, and 429 for too many
// connections of one user.
func TestRejectedCodes(t *testing.T) {
	parallel(t)
	// --jwt-leeway 0: an open connection's token expires at its exp, not 5 s
	// later.
	dev := startDev(t, t.TempDir(), "--rate-user", "5", "--rate-user-burst", "5", "--rate-conv", "1", "--rate-conv-burst", "3",
		"--max-conns-per-user", "3", "--jwt-leeway", "0")
	// unauthorized: the token expires while the connection is open
	tok, _ := auth.Mint(dev.Secret, "shortlived", 1500*time.Millisecond, time.Now())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, dev.EP.WebSocket+"?token="+tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	time.Sleep(2 * time.Second)
	c.Write(ctx, websocket.MessageText, []byte(`{"id":"x1","op":"create","conversation_id":"late","members":[]}`))
	if m, err := readRaw(ctx, c); err != nil || m["code"] != "unauthorized" {
		t.Errorf("command after the token expired: %v %v", m, err)
	}

	alice := dev.Dial(t, "alice")
	alice.Must(map[string]any{"op": "create", "conversation_id": "rl", "members": []string{"bob", "carol"}})
	// not_found: kick of a non-member
	if r, _ := alice.Do(map[string]any{"op": "kick", "conversation_id": "rl", "user_id": "zed"}); r == nil || r.Code != protocol.CodeNotFound {
		t.Errorf("kick of a non-member: %+v", r)
	}
	time.Sleep(time.Second) // refill alice's bucket
	// per conversation: three users, two sends each at once; the bucket holds 3
	var wg sync.WaitGroup
	var limited, ok atomic.Int32
	for _, u := range []string{"alice", "bob", "carol"} {
		cl := alice
		if u != "alice" {
			cl = dev.Dial(t, u)
		}
		for i := 0; i < 2; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := cl.Do(map[string]any{"op": "send", "conversation_id": "rl", "client_message_id": fmt.Sprintf("%s-%d", u, i), "body": "x"})
				switch {
				case err != nil:
					t.Error(err)
				case r.Code == protocol.CodeRateLimited && r.RetryAfterMS > 0:
					limited.Add(1)
				case r.Op == protocol.OpAccepted:
					ok.Add(1)
				default:
					t.Errorf("send: %+v", r)
				}
			}()
		}
	}
	wg.Wait()
	if limited.Load() == 0 || ok.Load() > 3 {
		t.Errorf("conversation limit 1/s burst 3: %d accepted, %d rate_limited", ok.Load(), limited.Load())
	}
	// per user: a burst of 10 commands against a bucket of 5
	dave := dev.Dial(t, "dave")
	limited.Store(0)
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := dave.Do(map[string]any{"op": "create", "conversation_id": fmt.Sprintf("d%d", i), "members": []string{}}); err == nil && r.Code == protocol.CodeRateLimited {
				limited.Add(1)
			}
		}()
	}
	wg.Wait()
	if limited.Load() < 5 {
		t.Errorf("user limit burst 5: only %d of 10 commands rate_limited", limited.Load())
	}
	// 429: a fourth connection of one user
	for i := 0; i < 2; i++ {
		dev.Dial(t, "dave")
	}
	_, resp, err := websocket.Dial(ctx, dev.EP.WebSocket+"?token="+dev.Token(t, "dave"), nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("fourth connection of a user: %v %v, want 429", resp, err)
	}
	// nothing rejected was written: rl holds its create, exactly the accepted messages; dave's admitted creates only
	msgs, daves := 0, 0
	for _, r := range readLog(t, dev.EP) {
		switch {
		case r.Conv == "late" || r.Sender == "shortlived":
			t.Errorf("a command of an expired token was written: %+v", r)
		case r.Conv == "rl" && r.Kind == "message":
			msgs++
		case r.Sender == "dave" && r.Kind == "create":
			daves++
		}
	}
	if msgs != int(ok.Load()) || daves != 10-int(limited.Load()) {
		t.Errorf("log holds %d messages in rl (%d accepted) and %d creates of dave (%d admitted)", msgs, ok.Load(), daves, 10-limited.Load())
	}
}

// TestUnavailableWithoutWorkers: with no worker to own a vshard, a command
// is answered unavailable with retry_after_ms once the gateway gives up.
func TestUnavailableWithoutWorkers(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir(), "--workers", "0")
	cl := dev.Dial(t, "alice")
	r, err := cl.Do(map[string]any{"op": "create", "conversation_id": "c", "members": []string{}})
	if err != nil || r.Code != protocol.CodeUnavailable || r.RetryAfterMS <= 0 {
		t.Fatalf("no workers: %+v %v", r, err)
	}
}

// TestHostileClients: while a well-behaved client sends at a steady rate,
// others send malformed and oversized frames, flood past the rate limit,
// try upgrades without a valid token and connect/disconnect thousands of
// times. Nothing of theirs is stored beyond what they were told was
// accepted, the server keeps serving, and every message of the
// well-behaved client is accepted and stored.
func TestHostileClients(t *testing.T) {
	sharing(t, 15, 15)
	dev := startDev(t, t.TempDir())
	good := dev.Dial(t, "good")
	good.Must(map[string]any{"op": "create", "conversation_id": "gc", "members": []string{}})
	flooder := dev.Dial(t, "flood")
	flooder.Must(map[string]any{"op": "create", "conversation_id": "fc", "members": []string{}})

	var mu sync.Mutex
	var accepted []acceptedMsg
	seq := 0
	// steady sends at 10/s for d; returns accepted/s
	steady := func(d time.Duration) float64 {
		start := time.Now()
		n := 0
		for tick := time.NewTicker(100 * time.Millisecond); time.Since(start) < d; <-tick.C {
			seq++
			cmid := fmt.Sprintf("g%d", seq)
			sent := time.Now()
			r, err := good.SendRetrying("gc", cmid, "steady")
			if err != nil || r.Op != protocol.OpAccepted {
				t.Errorf("good send %s: %+v %v", cmid, r, err)
				continue
			}
			n++
			mu.Lock()
			accepted = append(accepted, acceptedMsg{Conv: "gc", ClientMessageID: cmid, MessageID: r.MessageID, Sender: "good", Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
			mu.Unlock()
		}
		return float64(n) / time.Since(start).Seconds()
	}
	base := steady(5 * time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var attack sync.WaitGroup
	attackers := func(n int, f func(i int)) {
		for i := 0; i < n; i++ {
			attack.Add(1)
			go func() { defer attack.Done(); f(i) }()
		}
	}
	// 1,000 malformed frames on one connection
	attackers(1, func(int) {
		c, _, err := websocket.Dial(ctx, dev.EP.WebSocket+"?token="+dev.Token(t, "mal"), nil)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.CloseNow()
		go func() {
			for {
				if _, _, err := c.Read(ctx); err != nil {
					return
				}
			}
		}()
		bad := []string{`{`, `[]`, `{"id":"a","op":"send"}`, `{"id":"a","op":"send","conversation_id":"gc","client_message_id":"x y","body":"x"}`, "\xff\xfe", `{"id":"a","op":"create","conversation_id":"gc","members":"x"}`}
		for i := 0; i < 1000; i++ {
			if err := c.Write(ctx, websocket.MessageText, []byte(bad[i%len(bad)])); err != nil {
				t.Errorf("malformed frame %d closed the connection: %v", i, err)
				return
			}
		}
	})
	// oversized frames: each closes its connection with 1009
	attackers(20, func(int) {
		c, _, err := websocket.Dial(ctx, dev.EP.WebSocket+"?token="+dev.Token(t, "big"), nil)
		if err != nil {
			return // over the per-user connection limit: refused, as it should be
		}
		defer c.CloseNow()
		c.Write(ctx, websocket.MessageText, []byte(`{"id":"b","op":"send","conversation_id":"gc","client_message_id":"b","body":"`+strings.Repeat("x", 100<<10)+`"}`))
		c.Read(ctx)
	})
	// a flood far past the rate limits
	var floodMu sync.Mutex
	var flooded []acceptedMsg
	var limited atomic.Int64
	attackers(4, func(g int) {
		for i := 0; i < 500; i++ {
			cmid := fmt.Sprintf("f%d-%d", g, i)
			sent := time.Now()
			r, err := flooder.Do(map[string]any{"op": "send", "conversation_id": "fc", "client_message_id": cmid, "body": "flood"})
			if err != nil {
				return
			}
			if r.Code == protocol.CodeRateLimited {
				limited.Add(1)
			}
			if r.Op == protocol.OpAccepted {
				floodMu.Lock()
				flooded = append(flooded, acceptedMsg{Conv: "fc", ClientMessageID: cmid, MessageID: r.MessageID, Sender: "flood", Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
				floodMu.Unlock()
			}
		}
	})
	// upgrades without a valid token
	var refused atomic.Int64
	attackers(4, func(int) {
		for i := 0; i < 125; i++ {
			_, resp, err := websocket.Dial(ctx, dev.EP.WebSocket+"?token=forged."+fmt.Sprint(i), nil)
			if err != nil && resp != nil && resp.StatusCode == http.StatusUnauthorized {
				refused.Add(1)
			}
		}
	})
	// 2,000 connect/disconnect cycles
	var cycles atomic.Int64
	attackers(4, func(g int) {
		tok := dev.Token(t, fmt.Sprintf("cycler%d", g))
		for i := 0; i < 500; i++ {
			c, _, err := websocket.Dial(ctx, dev.EP.WebSocket+"?token="+tok, nil)
			if err != nil {
				continue
			}
			c.Close(websocket.StatusNormalClosure, "")
			cycles.Add(1)
		}
	})
	done := make(chan struct{})
	go func() { attack.Wait(); close(done) }()
	underAttack := steady(5 * time.Second)
	<-done
	after := steady(2 * time.Second)
	t.Logf("good client: %.1f accepted/s before, %.1f during the attack (%.0f%%), %.1f after; flood: %d accepted, %d rate_limited; %d forged upgrades refused; %d connect/disconnect cycles",
		base, underAttack, 100*underAttack/base, after, len(flooded), limited.Load(), refused.Load(), cycles.Load())
	if refused.Load() != 500 {
		t.Errorf("%d of 500 forged upgrades refused with 401", refused.Load())
	}
	if limited.Load() == 0 {
		t.Error("the flood was never rate limited")
	}
	// Only what clients were told was accepted is in the log.
	all := append(accepted, flooded...)
	rows := readLog(t, dev.EP)
	told := map[string]bool{}
	for _, a := range all {
		told[a.Conv+"/"+a.ClientMessageID] = true
	}
	for _, r := range rows {
		if r.Kind == "message" && !told[r.Conv+"/"+r.ClientMessageID] {
			t.Errorf("stored but never accepted: %+v", r)
		}
	}
	checkWorld(t, dev.EP, all)
}
