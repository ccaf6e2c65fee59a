package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// forgedLines are wire requests as a gateway would send them, naming their
// sender: a message from alice into her conversation, and a conversation
// created by mallory with alice in it. On an open link a worker would take
// both.
var forgedLines = []string{
	`{"rid":1,"user":"alice","req":{"op":"send","id":"f1","conversation_id":"lt","client_message_id":"forged-1","body":"forged"}}`,
	`{"rid":2,"user":"mallory","req":{"op":"create","id":"f2","conversation_id":"forged","members":["alice"]}}`,
}

// TestLinkTLSRefusesUnauthenticatedWriters: with the secured stack's
// mutual TLS link, a worker's gateway port takes no command from a raw TCP
// client (the old plaintext wire format), from a TLS client without a
// certificate, from one with a certificate of another CA (the stack's
// Kafka/etcd client certificate) or from one offering the worker's own
// link certificate. None of what they send reaches the log or Postgres,
// while a message sent through the gateway (over the same worker's port)
// does, and the worker logs each refusal.
func TestLinkTLSRefusesUnauthenticatedWriters(t *testing.T) {
	parallel(t)
	for _, l := range forgedLines { // the lines are requests a worker reads
		var r link.Request
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil || r.Req == nil || r.User == "" {
			t.Fatalf("forged line %s: %+v %v", l, r, err)
		}
	}
	s := startSecured(t)
	port := strconv.Itoa(stacktest.FreePort(t))
	addr := "127.0.0.1:" + port
	w := s.startRole(clustersec.RoleWorker, "--listen", addr)
	s.startRole(clustersec.RolePersist)

	alice := s.dev.Dial(t, "alice")
	alice.Must(map[string]any{"op": "create", "conversation_id": "lt", "members": []string{"bob"}})
	if r, err := alice.SendRetrying("lt", "m1", "through the gateway"); err != nil || r.Op != "accepted" {
		t.Fatalf("send through the gateway: %+v %v", r, err)
	}

	worker := clustersec.LinkDir(s.link, clustersec.RoleWorker)
	workerCert, err := tls.LoadX509KeyPair(worker.Cert, worker.Key)
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := tls.LoadX509KeyPair(s.certs.ClientCert, s.certs.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	attempts := []struct {
		name string
		tls  *tls.Config // nil: plaintext
	}{
		{"raw TCP", nil},
		{"TLS without a certificate", &tls.Config{InsecureSkipVerify: true}},
		{"TLS with another CA's certificate", &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{otherCA},
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &otherCA, nil }}},
		{"TLS with the worker's certificate", &tls.Config{InsecureSkipVerify: true,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &workerCert, nil }}},
	}
	for _, a := range attempts {
		got, err := forge(addr, a.tls)
		if bytes.Contains(got, []byte(`"rid"`)) {
			t.Fatalf("%s: the worker answered: %q", a.name, got)
		}
		t.Logf("%s: %d bytes back, %v", a.name, len(got), err)
	}

	// A message sent after the forged ones, in the same conversation (the
	// same vshard and partition), reaches Postgres and the log: by then
	// anything forged would have too.
	if r, err := alice.SendRetrying("lt", "m2", "after the forgeries"); err != nil || r.Op != "accepted" {
		t.Fatalf("send after the forgeries: %+v %v", r, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.dev.EP.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	stacktest.WaitFor(t, 20*time.Second, "m2 in Postgres", func() bool {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE conversation_id = 'lt' AND client_message_id = 'm2'`).Scan(&n)
		return err == nil && n == 1
	})
	var forged int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE conversation_id = 'forged' OR client_message_id LIKE 'forged%'`).Scan(&forged); err != nil {
		t.Fatal(err)
	}
	if forged != 0 {
		t.Fatalf("%d forged events in Postgres", forged)
	}

	// The log itself, read uncommitted: not even an aborted record.
	rd := s.roleClient(clustersec.RoleReader, kgo.ConsumeTopics(logrecord.DefaultTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	seenM2 := false
	for !seenM2 {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("m2 not read from the log: %v", err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if bytes.Contains(r.Value, []byte("forged")) {
				t.Errorf("a forged record in the log at partition %d offset %d: %s", r.Partition, r.Offset, r.Value)
			}
			if bytes.Contains(r.Value, []byte("after the forgeries")) {
				seenM2 = true
			}
		})
	}

	b, _ := os.ReadFile(w.Log)
	if n := strings.Count(string(b), "refused a link that did not authenticate as a gateway"); n < len(attempts) {
		t.Fatalf("the worker logged %d refused links, want %d; log:\n%s", n, len(attempts), stacktest.Tail(w.Log))
	}
}

// forge connects to addr (with TLS if c is set), writes the forged lines
// and returns what comes back until the worker closes the connection (or 5
// s pass).
func forge(addr string, c *tls.Config) ([]byte, error) {
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(5 * time.Second))
	var conn net.Conn = raw
	if c != nil {
		tc := tls.Client(raw, c)
		if err := tc.Handshake(); err != nil {
			return nil, err
		}
		conn = tc
	}
	if _, err := conn.Write([]byte(strings.Join(forgedLines, "\n") + "\n")); err != nil {
		return nil, err
	}
	got, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return got, errors.New("the worker kept the connection open 5 s")
	}
	return got, err
}
