package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestKcatExample runs the worked example of docs/data.md: kcat with
// isolation.level=read_committed prints every committed event and nothing
// of an aborted transaction (and read_uncommitted would show it, so the
// check has teeth).
func TestKcatExample(t *testing.T) {
	parallel(t)
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("kcat is not installed; .ci/run installs Debian's kcat")
		}
		t.Skip("kcat is not installed (apt-get install kcat)")
	}
	dev := startDev(t, t.TempDir())
	alice := dev.Dial(t, "alice")
	alice.Must(map[string]any{"op": "create", "conversation_id": "k1", "members": []string{"bob"}})
	var accepted []acceptedMsg
	for i := 0; i < 20; i++ {
		cmid := fmt.Sprintf("m%d", i)
		r, err := alice.SendRetrying("k1", cmid, "hello")
		if err != nil || r.Op != protocol.OpAccepted {
			t.Fatalf("send: %+v %v", r, err)
		}
		accepted = append(accepted, acceptedMsg{Conv: "k1", ClientMessageID: cmid, MessageID: r.MessageID, Seq: r.Seq})
	}

	// An aborted transaction in the same partition, as a fenced writer leaves.
	part := logrecord.Partition(logrecord.VShard("k1", dev.EP.VShards), dev.EP.Partitions)
	cl, err := kgo.NewClient(kgo.SeedBrokers(dev.EP.Kafka...), kgo.TransactionalID("kcat-test-aborted"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	val := `{"v":1,"kind":"message","conversation_id":"k1","seq":2,"message_id":"ABORTED","client_message_id":"zombie","sender":"alice","body":"never","created_at":"2026-11-29T00:00:00Z","vshard":0,"epoch":0}`
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: dev.EP.Topic, Partition: part, Key: []byte("k1"), Value: []byte(val)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}

	run := func(isolation string) (events map[string]string, aborted bool) {
		out, err := exec.Command(kcat, "-b", dev.EP.Kafka[0], "-C", "-t", dev.EP.Topic, "-e", "-q",
			"-X", "isolation.level="+isolation, "-f", "%p\t%o\t%k\t%h\t%s\n").Output()
		if err != nil {
			t.Fatalf("kcat: %v", err)
		}
		events = map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.SplitN(line, "\t", 5)
			if len(f) != 5 {
				t.Fatalf("kcat line %q", line)
			}
			var e logrecord.Event
			if err := json.Unmarshal([]byte(f[4]), &e); err != nil {
				t.Fatalf("value of %q: %v", line, err)
			}
			if e.MessageID == "ABORTED" {
				aborted = true
				continue
			}
			if want := "vshard=" + fmt.Sprint(e.VShard) + ",epoch=" + fmt.Sprint(e.Epoch) + ",kind=" + e.Kind; f[3] != want {
				t.Errorf("headers %q, want %q", f[3], want)
			}
			if e.Kind == logrecord.KindTakeover {
				continue
			}
			if f[2] != e.ConversationID {
				t.Errorf("key %q, conversation %q", f[2], e.ConversationID)
			}
			k := fmt.Sprintf("%s/%d", e.ConversationID, e.Seq)
			if prev, ok := events[k]; ok && prev != e.MessageID {
				t.Errorf("seq %s twice in the committed log", k)
			}
			events[k] = e.MessageID
		}
		return events, aborted
	}
	events, aborted := run("read_committed")
	if aborted {
		t.Error("kcat with read_committed printed a record of an aborted transaction")
	}
	if len(events) != len(accepted)+1 {
		t.Errorf("kcat printed %d events, want the create and %d messages", len(events), len(accepted))
	}
	for _, a := range accepted {
		if events[fmt.Sprintf("k1/%d", a.Seq)] != a.MessageID {
			t.Errorf("accepted k1/%d (%s) missing from kcat's output", a.Seq, a.MessageID)
		}
	}
	if _, aborted := run("read_uncommitted"); !aborted {
		t.Error("read_uncommitted did not show the aborted record: the check above proves nothing")
	}
}
