package e2e

import (
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestExpiredQueuedCommandIsNotApplied: a command that waits in a writer's
// queue past the gateway's call timeout — its client was told the outcome
// is unknown — must not be applied when the writer gets to it.
//
// Every commit of the worker takes 5 s (a fault switch), the gateway gives
// one attempt 2 s. A kick queued behind a send's commit is answered
// unavailable after 2 s and reaches the front of the queue after ~5 s,
// past its deadline: the log must never hold it.
func TestExpiredQueuedCommandIsNotApplied(t *testing.T) {
	sharing(t, 10, 30)
	dev := startDev(t, t.TempDir(), "--workers", "0", "--call-timeout", "2s")
	dev.StartWorker(t, "wa", "CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT=5s", "CHATPIPE_TXN_TIMEOUT=60s")
	stacktest.WaitOwned(t, 120*time.Second, "wa to own every vshard", dev.EP, dev.EP.All(), "wa", dev.EP.All())

	u1 := dev.Dial(t, "u1")
	// The create's answer comes too late as well (unavailable), but it
	// was decided at once: wait until it is in the read model.
	if _, err := u1.Do(map[string]any{"op": "create", "conversation_id": "dl1", "members": []string{"u2"}}); err != nil {
		t.Fatal(err)
	}
	readDB(t, dev.EP, 1)

	// A send occupies the writer for 5 s; the kick queues behind it.
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		u1.Do(map[string]any{"op": "send", "conversation_id": "dl1", "client_message_id": "m1", "body": "hi"})
	}()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	kick, err := u1.Do(map[string]any{"op": "kick", "conversation_id": "dl1", "user_id": "u2"})
	if err != nil {
		t.Fatal(err)
	}
	if kick.Code != protocol.CodeUnavailable {
		t.Fatalf("kick answered %+v after %v, want unavailable (outcome unknown) after the 2 s call timeout", kick, time.Since(start))
	}
	<-sent
	// Without a deadline the kick would be decided at ~5 s and committed
	// at ~10 s; give the writer well past that.
	time.Sleep(15 * time.Second)

	var kicks, sends, creates int
	for _, r := range readLog(t, dev.EP) {
		if r.Conv != "dl1" {
			continue
		}
		switch r.Kind {
		case "kick":
			kicks++
		case "message":
			sends++
		case "create":
			creates++
		}
	}
	if kicks != 0 {
		t.Errorf("the log holds %d kicks: a command whose client was told 'outcome unknown' was applied late", kicks)
	}
	if creates != 1 || sends != 1 {
		t.Errorf("log has %d creates and %d messages of dl1, want 1 and 1", creates, sends)
	}
}
