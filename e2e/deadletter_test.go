package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// sinkStack is `chatpipe dev` with persist as its own process (so that its
// /readyz and /metrics can be read), a conversation c of alice and bob, and
// a connection to Postgres.
type sinkStack struct {
	dev   *devProc
	admin string // persist's admin address
	alice *client
	db    *pgx.Conn
	part  int32 // c's partition
	v     int   // c's vshard
}

func startSinkStack(t *testing.T) *sinkStack {
	t.Helper()
	dev := startDev(t, t.TempDir(), "--persist=false")
	s := &sinkStack{dev: dev, admin: fmt.Sprintf("127.0.0.1:%d", stacktest.FreePort(t))}
	stacktest.StartProc(t, dev.Dir, "persist", nil, "persist", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"),
		"--log-level", "warn", "--admin", s.admin)
	s.alice = dev.Dial(t, "alice")
	s.alice.Must(map[string]any{"op": "create", "conversation_id": "c", "members": []string{"bob"}})
	s.alice.Must(map[string]any{"op": "send", "conversation_id": "c", "client_message_id": "before", "body": "before"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if s.db, err = pgx.Connect(ctx, dev.EP.Postgres); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.db.Close(context.Background()) })
	stacktest.WaitFor(t, 30*time.Second, "the first message in Postgres", func() bool { return s.stored(t, "before") })
	s.v = logrecord.VShard("c", dev.EP.VShards)
	s.part = logrecord.Partition(s.v, dev.EP.Partitions)
	return s
}

// stored reports whether c's message with client_message_id cmid is in
// Postgres.
func (s *sinkStack) stored(t *testing.T, cmid string) bool {
	t.Helper()
	var n int
	if err := s.db.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE conversation_id = 'c' AND client_message_id = $1`, cmid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// inject commits value to c's partition through a transactional producer
// of its own, with the headers of c's vshard, and returns its offset.
func (s *sinkStack) inject(t *testing.T, key string, value []byte) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.dev.EP.Kafka...), kgo.TransactionalID("e2e-injector-"+key),
		kgo.DefaultProduceTopic(s.dev.EP.Topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	r := &kgo.Record{Partition: s.part, Key: []byte(key), Value: value, Headers: []kgo.RecordHeader{
		{Key: logrecord.HeaderVShard, Value: []byte(strconv.Itoa(s.v))},
		{Key: logrecord.HeaderEpoch, Value: []byte("1")},
		{Key: logrecord.HeaderKind, Value: []byte(logrecord.KindMessage)},
	}}
	res := cl.ProduceSync(ctx, r)
	if err := res.FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	return res[0].Record.Offset
}

func (s *sinkStack) readyz(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPoisonRecordIsDeadLettered: a committed message whose body Postgres
// refuses (a NUL byte: SQLSTATE 22021) does not stop persist: it lands in
// persist's dead_letters (its one dead letter), what can be written of it
// is (its read-model changes: the conversation's last_seq), a message sent
// after it on the same partition is in Postgres within seconds and in the
// read model with it, persist's /readyz says degraded, its counter is 1,
// and `chatpipe admin dead-letters` lists it.
func TestPoisonRecordIsDeadLettered(t *testing.T) {
	parallel(t)
	s := startSinkStack(t)
	bad := &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "poison", Seq: 1, MessageID: "poison-1",
		ClientMessageID: "p1", Sender: "mallory", Body: "nul\x00byte", CreatedAt: time.Now().UTC(), VShard: s.v, Epoch: 1}
	value, err := bad.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	off := s.inject(t, "poison", value)

	start := time.Now()
	s.alice.Must(map[string]any{"op": "send", "conversation_id": "c", "client_message_id": "after", "body": "after"})
	stacktest.WaitFor(t, 15*time.Second, "the message after the poison record in Postgres", func() bool { return s.stored(t, "after") })
	t.Logf("message after the poison record stored %v after its send", time.Since(start).Round(time.Millisecond))

	ctx := context.Background()
	var state string
	var got []byte
	if err := s.db.QueryRow(ctx, `SELECT coalesce(sqlstate, ''), record_value FROM dead_letters
		WHERE consumer = 'persist' AND topic = $1 AND log_partition = $2 AND log_offset = $3`, s.dev.EP.Topic, s.part, off).Scan(&state, &got); err != nil {
		t.Fatalf("persist's dead letter at %d/%d: %v", s.part, off, err)
	}
	if state != "22021" || !bytes.Equal(got, value) {
		t.Errorf("dead letter: sqlstate %q, value %q; want 22021, %q", state, got, value)
	}
	var n int
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM dead_letters`).Scan(&n); err != nil || n != 1 {
		t.Errorf("dead_letters holds %d rows (%v), want 1 (one per record, persist's)", n, err)
	}
	// persist's offset is past the poison record, and the read model with
	// it: the message after it is there (stored in the same transaction as
	// its event), and so is the poison record's own change, although its
	// event row is not.
	var next, afterSeq, lastSeq, poisonSeq int64
	if err := s.db.QueryRow(ctx, `SELECT
		(SELECT next_offset FROM consumer_offsets WHERE consumer = 'persist' AND topic = $1 AND log_partition = $2),
		(SELECT seq FROM events WHERE conversation_id = 'c' AND client_message_id = 'after'),
		(SELECT last_seq FROM conversations WHERE conversation_id = 'c'),
		coalesce((SELECT last_seq FROM conversations WHERE conversation_id = 'poison'), 0)`,
		s.dev.EP.Topic, s.part).Scan(&next, &afterSeq, &lastSeq, &poisonSeq); err != nil {
		t.Fatal(err)
	}
	if next <= off {
		t.Errorf("persist's stored offset of partition %d is %d, want past the poison record at %d", s.part, next, off)
	}
	if lastSeq != afterSeq {
		t.Errorf("the read model has c at last_seq %d, want %d (the message after the poison record)", lastSeq, afterSeq)
	}
	if poisonSeq != 1 {
		t.Errorf("the read model has the poison record's conversation at last_seq %d, want 1 (its read-model changes written with its dead letter)", poisonSeq)
	}

	code, body := s.readyz(t)
	if code != http.StatusOK || !strings.Contains(body, "degraded") || !strings.Contains(body, "1 dead letters") {
		t.Errorf("persist /readyz = %d %q, want 200 degraded with 1 dead letter", code, body)
	}
	if v := stacktest.Metric(t, "http://"+s.admin+"/metrics", "chatpipe_persist_dead_letters_total"); v != 1 {
		t.Errorf("chatpipe_persist_dead_letters_total = %v, want 1", v)
	}
	out, err := exec.Command(binary, "admin", "dead-letters", "--endpoints", filepath.Join(s.dev.Dir, "endpoints.json"), "--consumer", "persist", "--value-width", "1000").CombinedOutput()
	if err != nil {
		t.Fatalf("admin dead-letters: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "CONSUMER") {
		t.Fatalf("admin dead-letters printed:\n%s", out)
	}
	for _, want := range []string{"persist", strconv.FormatInt(off, 10), "poison", "22021", `nul\\u0000byte`} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("admin dead-letters row lacks %q:\n%s", want, out)
		}
	}
}

// TestNewerVersionHaltsPersist: a committed record of a newer schema version
// is neither skipped nor dead-lettered: persist stops at it (/readyz 503
// naming the upgrade, halted gauge 1) and writes nothing after it.
func TestNewerVersionHaltsPersist(t *testing.T) {
	parallel(t)
	s := startSinkStack(t)
	s.inject(t, "newer", []byte(`{"v":99,"kind":"message","conversation_id":"c","seq":3,"body":{"parts":["x"]}}`))
	s.alice.Must(map[string]any{"op": "send", "conversation_id": "c", "client_message_id": "after", "body": "after"})
	stacktest.WaitFor(t, 30*time.Second, "persist to report itself stopped", func() bool {
		code, body := s.readyz(t)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "upgrade")
	})
	if v := stacktest.Metric(t, "http://"+s.admin+"/metrics", "chatpipe_persist_halted"); v != 1 {
		t.Errorf("chatpipe_persist_halted = %v, want 1", v)
	}
	time.Sleep(2 * time.Second)
	if s.stored(t, "after") {
		t.Error("persist wrote a message that follows a record it cannot read")
	}
	var n int
	if err := s.db.QueryRow(context.Background(), `SELECT count(*) FROM dead_letters`).Scan(&n); err != nil || n != 0 {
		t.Errorf("dead_letters holds %d rows (%v), want none", n, err)
	}
}
