package clustersec_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/devstack"
)

const topic = "chatpipe.log"

// broker starts a kfake broker with TLS, SCRAM users and ACLs on, the
// topic created, and every role's ACLs granted to a user named as the role
// (password "pw-<role>") by the superuser "admin".
func broker(t *testing.T) (addr string, certs devstack.Certs, dir string) {
	t.Helper()
	dir = t.TempDir()
	certs, err := devstack.WriteCerts(filepath.Join(dir, "certs"))
	if err != nil {
		t.Fatal(err)
	}
	stls, err := certs.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	opts := []kfake.Opt{kfake.TLS(stls), kfake.EnableSASL(), kfake.EnableACLs(), kfake.Superuser("SCRAM-SHA-256", "admin", "pw-admin")}
	for _, r := range clustersec.Roles {
		opts = append(opts, kfake.User("SCRAM-SHA-256", r, "pw-"+r))
	}
	k, err := devstack.StartKafka(filepath.Join(dir, "kafka"), 0, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	admin := kafkaOpts(t, certs, dir, "admin")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.Addr())}, admin...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, r := range clustersec.Roles {
		acls, err := clustersec.ACLs(r, topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range acls {
			res, err := kadm.NewClient(cl).CreateACLs(ctx, a.Builder("User:"+r))
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range res {
				if x.Err != nil {
					t.Fatalf("create ACL for %s: %v", r, x.Err)
				}
			}
		}
	}
	// init creates the topic with its own user.
	if err := devstack.EnsureTopic(ctx, []string{k.Addr()}, topic, 2, kafkaOpts(t, certs, dir, clustersec.RoleInit)...); err != nil {
		t.Fatalf("init creates the topic: %v", err)
	}
	return k.Addr(), certs, dir
}

// kafkaOpts are the client options of user (password pw-<user>) over TLS.
func kafkaOpts(t *testing.T, certs devstack.Certs, dir, user string) []kgo.Opt {
	t.Helper()
	pw := filepath.Join(dir, user+".pw")
	if err := os.WriteFile(pw, []byte("pw-"+user+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := clustersec.Kafka{TLS: clustersec.TLS{CAFile: certs.CAFile}, SASLMechanism: "SCRAM-SHA-256", SASLUser: user, SASLPasswordFile: pw}.Opts()
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

func TestProbe(t *testing.T) {
	addr, certs, dir := broker(t)
	ctx := context.Background()
	good := kafkaOpts(t, certs, dir, clustersec.RoleWorker)
	if err := clustersec.Probe(ctx, []string{addr}, good, "good"); err != nil {
		t.Fatalf("right credentials: %v", err)
	}
	bad := filepath.Join(dir, "bad.pw")
	os.WriteFile(bad, []byte("nope"), 0o600)
	k := clustersec.Kafka{TLS: clustersec.TLS{CAFile: certs.CAFile}, SASLMechanism: "scram-sha-256", SASLUser: "worker", SASLPasswordFile: bad}
	opts, err := k.Opts()
	if err != nil {
		t.Fatal(err)
	}
	err = clustersec.Probe(ctx, []string{addr}, opts, k.String())
	if err == nil || !strings.Contains(err.Error(), `"worker"`) {
		t.Fatalf("wrong password: %v", err)
	}
	t.Logf("wrong password: %v", err)
	// Without the CA the server's certificate is not trusted.
	k.TLS = clustersec.TLS{Enabled: true}
	k.SASLPasswordFile = filepath.Join(dir, "worker.pw")
	opts, _ = k.Opts()
	if err := clustersec.Probe(ctx, []string{addr}, opts, k.String()); err == nil {
		t.Fatal("an untrusted server certificate was accepted")
	} else {
		t.Logf("untrusted CA: %v", err)
	}
}

func TestOptsErrors(t *testing.T) {
	dir := t.TempDir()
	for _, k := range []clustersec.Kafka{
		{SASLMechanism: "gssapi", SASLUser: "u", SASLPasswordFile: filepath.Join(dir, "x")},
		{SASLMechanism: "plain", SASLUser: "u"},
		{SASLMechanism: "plain", SASLUser: "u", SASLPasswordFile: filepath.Join(dir, "missing")},
		{SASLMechanism: "oauthbearer"},
		{SASLUser: "u"},
		{TLS: clustersec.TLS{CertFile: "c.pem"}},
		{TLS: clustersec.TLS{CAFile: filepath.Join(dir, "missing.pem")}},
	} {
		if _, err := k.Opts(); err == nil {
			t.Errorf("%+v: no error", k)
		}
	}
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("abc\n"), 0o600)
	opts, err := clustersec.Kafka{SASLMechanism: "OAUTHBEARER", SASLTokenFile: tok}.Opts()
	if err != nil || len(opts) != 1 {
		t.Fatalf("oauthbearer: %v %d", err, len(opts))
	}
	if opts, err := (clustersec.Kafka{}).Opts(); err != nil || len(opts) != 0 {
		t.Fatalf("zero value: %v %d", err, len(opts))
	}
}

// TestRoleACLs checks the least-privilege ACLs on a broker that enforces
// them: each role can do its work and not another's.
func TestRoleACLs(t *testing.T) {
	addr, certs, dir := broker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := func(role string, opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(addr)}, kafkaOpts(t, certs, dir, role)...), opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	// init may check the topic as admin check-config does; the gateway may
	// read its end offsets for the ops page.
	if _, err := devstack.DescribeTopic(ctx, []string{addr}, topic, kafkaOpts(t, certs, dir, clustersec.RoleInit)...); err != nil {
		t.Fatalf("init describes the topic: %v", err)
	}
	ends, err := kadm.NewClient(client(clustersec.RoleGateway)).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("gateway lists end offsets: %v", err)
	}
	// The gateway cannot create topics.
	if err := devstack.EnsureTopic(ctx, []string{addr}, "other", 1, kafkaOpts(t, certs, dir, clustersec.RoleGateway)...); !errors.Is(err, kerr.TopicAuthorizationFailed) &&
		!errors.Is(err, kerr.ClusterAuthorizationFailed) {
		t.Fatalf("gateway creates a topic: %v, want an authorization failure", err)
	}
	// The worker commits a transaction with its transactional id.
	w := client(clustersec.RoleWorker, kgo.TransactionalID(clustersec.TransactionalIDPrefix+"0"), kgo.DefaultProduceTopic(topic))
	if err := w.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := w.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatalf("worker produce: %v", err)
	}
	if err := w.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("worker commit: %v", err)
	}
	// A transactional id outside the prefix is refused.
	other := client(clustersec.RoleWorker, kgo.TransactionalID("someone-else"), kgo.DefaultProduceTopic(topic), kgo.RecordDeliveryTimeout(5*time.Second))
	if err := other.BeginTransaction(); err == nil {
		err = other.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr()
		if !errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
			t.Fatalf("worker with a foreign transactional id: %v", err)
		}
	}
	// Persist reads with its group and commits, but cannot produce.
	p := client(clustersec.RolePersist, kgo.ConsumerGroup(clustersec.PersistGroup), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.DisableAutoCommit())
	fs := p.PollFetches(ctx)
	if err := fs.Err(); err != nil || fs.NumRecords() != 1 {
		t.Fatalf("persist fetch: %v, %d records", err, fs.NumRecords())
	}
	if err := p.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("persist commit: %v", err)
	}
	pp := client(clustersec.RolePersist, kgo.DefaultProduceTopic(topic), kgo.RecordDeliveryTimeout(5*time.Second))
	if err := pp.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); !errors.Is(err, kerr.TopicAuthorizationFailed) &&
		!errors.Is(err, kerr.ClusterAuthorizationFailed) {
		t.Fatalf("persist produce: %v, want an authorization error", err)
	}
	// The worker cannot commit offsets of persist's group.
	adm := kadm.NewClient(client(clustersec.RoleWorker))
	off := kadm.Offsets{}
	off.AddOffset(topic, 0, 0, -1)
	resp, err := adm.CommitOffsets(ctx, clustersec.PersistGroup, off)
	if err == nil {
		err = resp.Error()
	}
	if !errors.Is(err, kerr.GroupAuthorizationFailed) {
		t.Fatalf("worker commits persist's offsets: %v, want GROUP_AUTHORIZATION_FAILED", err)
	}
}

// TestDocumentedACLs: docs/operations.md lists every role's kafka-acls.sh
// commands as clustersec.ACLs has them (chatpipe admin kafka-acls prints the
// same).
func TestDocumentedACLs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range clustersec.Roles {
		acls, _ := clustersec.ACLs(r, topic)
		for _, a := range acls {
			if c := a.Command("User:chatpipe-"+r, "$BROKERS", "admin.properties"); !strings.Contains(string(doc), c) {
				t.Errorf("docs/operations.md lacks: %s", c)
			}
		}
	}
}

func TestACLCommand(t *testing.T) {
	acls, err := clustersec.ACLs(clustersec.RoleWorker, topic)
	if err != nil {
		t.Fatal(err)
	}
	got := acls[1].Command("User:worker", "$BROKERS", "admin.properties")
	want := "kafka-acls.sh --bootstrap-server $BROKERS --command-config admin.properties --add --allow-principal User:worker --operation Describe --operation Write --transactional-id chatpipe-vshard- --resource-pattern-type prefixed"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if _, err := clustersec.ACLs("nobody", topic); err == nil {
		t.Fatal("unknown role accepted")
	}
}
