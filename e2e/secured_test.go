package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// securedStack is the e2e stack in secured mode: a kfake broker serving TLS
// with SASL and ACLs enforced, an etcd member serving TLS that wants client
// certificates, and `chatpipe dev` running the gateway (with the gateway's
// Kafka credentials and link certificate) against both. Workers and
// persist run as their own processes with their own credentials
// (startRole); the gateway↔worker link is mutual TLS from the link CA that
// `chatpipe init --link-certs` made.
type securedStack struct {
	t      *testing.T
	dir    string
	certs  devstack.Certs
	link   string // chatpipe init --link-certs directory
	broker string
	etcd   string
	dev    *devProc
}

// securedUsers are the SASL users of the secured broker: one per role, with
// a mechanism each, so every mechanism kfake knows is used.
var securedUsers = map[string]string{
	clustersec.RoleWorker:  "SCRAM-SHA-512",
	clustersec.RolePersist: "SCRAM-SHA-256",
	clustersec.RoleGateway: "SCRAM-SHA-256",
	clustersec.RoleReader:  "PLAIN",
	clustersec.RoleInit:    "SCRAM-SHA-256",
}

// startSecured starts the secured stack. The topic is created by the
// superuser before dev starts, and every role's ACLs (clustersec.ACLs) are
// granted to its user with CreateACLs, as an operator would with
// kafka-acls.sh.
func startSecured(t *testing.T) *securedStack {
	t.Helper()
	dir := t.TempDir()
	certs, err := devstack.WriteCerts(filepath.Join(dir, "certs"))
	if err != nil {
		t.Fatal(err)
	}
	s := &securedStack{t: t, dir: dir, certs: certs, link: filepath.Join(dir, "link")}
	if r := runChatpipe(t, "init", "--link-certs", s.link, "--link-certs-validity", "24h"); r.err != nil {
		t.Fatalf("init --link-certs: %v\n%s", r.err, r.out)
	}
	s.writeSecret("admin", "pw-admin")
	opts := []kfake.Opt{kfake.EnableSASL(), kfake.EnableACLs(), kfake.Superuser("SCRAM-SHA-512", "admin", "pw-admin")}
	for role, mech := range securedUsers {
		s.writeSecret(role, "pw-"+role)
		opts = append(opts, kfake.User(mech, role, "pw-"+role))
	}
	stls, err := certs.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	k, err := devstack.StartKafka(filepath.Join(dir, "kafka"), 0, nil, append(opts, kfake.TLS(stls))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	s.broker = k.Addr()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := s.kafkaOpts("admin", "SCRAM-SHA-512", "pw-admin")
	// dev's 8 hashed partitions and its 2 dedicated vshards' own
	if err := devstack.EnsureTopic(ctx, []string{s.broker}, logrecord.DefaultTopic, 8+2, admin...); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.broker)}, admin...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for role := range securedUsers {
		acls, err := clustersec.ACLs(role, logrecord.DefaultTopic)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range acls {
			res, err := kadm.NewClient(cl).CreateACLs(ctx, a.Builder("User:"+role))
			if err == nil {
				for _, r := range res {
					err = errors.Join(err, r.Err)
				}
			}
			if err != nil {
				t.Fatalf("ACL %s for %s: %v", a.Command("User:"+role, s.broker, "admin.properties"), role, err)
			}
		}
	}

	e, err := devstack.StartEtcdTLS(ctx, filepath.Join(dir, "etcd"), 0, nil,
		devstack.EtcdTLS{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, CAFile: certs.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	s.etcd = strings.Join(e.Endpoints(), ",")

	devDir := filepath.Join(dir, "dev")
	if err := os.MkdirAll(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"--kafka", s.broker, "--etcd", s.etcd, "--workers", "0", "--persist=false"}
	args = append(append(args, s.roleFlags(clustersec.RoleGateway)...), s.linkFlags(clustersec.RoleGateway)...)
	s.dev = startDev(t, devDir, args...)
	return s
}

// linkFlags are the link TLS flags of role (gateway or worker), from the
// files init made.
func (s *securedStack) linkFlags(role string) []string {
	f := clustersec.LinkDir(s.link, role)
	return []string{"--link-tls-ca", f.CA, "--link-tls-cert", f.Cert, "--link-tls-key", f.Key}
}

func (s *securedStack) writeSecret(name, secret string) {
	s.t.Helper()
	if err := os.WriteFile(s.secretFile(name), []byte(secret+"\n"), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

func (s *securedStack) secretFile(name string) string { return filepath.Join(s.dir, name+".password") }

// etcdFlags are the etcd client TLS flags of every role.
func (s *securedStack) etcdFlags() []string {
	return []string{"--etcd-tls-ca", s.certs.CAFile, "--etcd-tls-cert", s.certs.ClientCert, "--etcd-tls-key", s.certs.ClientKey}
}

// roleFlags are role's Kafka credentials and the etcd TLS flags.
func (s *securedStack) roleFlags(role string) []string {
	return append([]string{"--kafka-tls-ca", s.certs.CAFile, "--kafka-sasl-mechanism", securedUsers[role],
		"--kafka-sasl-user", role, "--kafka-sasl-password-file", s.secretFile(role)}, s.etcdFlags()...)
}

// startRole runs `chatpipe <role>` against the stack with role's
// credentials (the worker role as worker id "w1").
func (s *securedStack) startRole(role string, extra ...string) *proc {
	args := []string{role, "--endpoints", filepath.Join(s.dev.Dir, "endpoints.json"), "--log-level", "warn"}
	if role == clustersec.RoleWorker {
		args = append(append(args, "--id", "w1"), s.linkFlags(role)...)
	}
	return stacktest.StartProc(s.t, s.dir, role, nil, append(append(args, s.roleFlags(role)...), extra...)...)
}

// kafkaOpts are a client's options for user over TLS, from the same code
// the roles use.
func (s *securedStack) kafkaOpts(user, mech, password string) []kgo.Opt {
	s.t.Helper()
	file := filepath.Join(s.dir, user+"-"+mech+".pw")
	if err := os.WriteFile(file, []byte(password), 0o600); err != nil {
		s.t.Fatal(err)
	}
	opts, err := clustersec.Kafka{TLS: clustersec.TLS{CAFile: s.certs.CAFile}, SASLMechanism: mech, SASLUser: user, SASLPasswordFile: file}.Opts()
	if err != nil {
		s.t.Fatal(err)
	}
	return opts
}

// roleClient is a Kafka client with role's credentials.
func (s *securedStack) roleClient(role string, opts ...kgo.Opt) *kgo.Client {
	s.t.Helper()
	base := append([]kgo.Opt{kgo.SeedBrokers(s.broker)}, s.kafkaOpts(role, securedUsers[role], "pw-"+role)...)
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(cl.Close)
	return cl
}

// startSecuredForChecks starts the secured stack and gives the test's own
// clients what they need against it: the reader's Kafka credentials (the
// world checks read the committed log) and an etcd client certificate (the
// tests read the owner rows).
func startSecuredForChecks(t *testing.T) *securedStack {
	t.Helper()
	s := startSecured(t)
	s.dev.EP.KafkaOpts = s.kafkaOpts(clustersec.RoleReader, securedUsers[clustersec.RoleReader], "pw-"+clustersec.RoleReader)
	etls, err := clustersec.TLS{CAFile: s.certs.CAFile, CertFile: s.certs.ClientCert, KeyFile: s.certs.ClientKey}.Config()
	if err != nil {
		t.Fatal(err)
	}
	s.dev.EP.EtcdTLS = etls
	return s
}

// startWorker runs `chatpipe worker` as id with the worker's Kafka user,
// etcd client certificate and link certificate, and env.
func (s *securedStack) startWorker(id string, env ...string) *proc {
	args := []string{"worker", "--endpoints", filepath.Join(s.dev.Dir, "endpoints.json"), "--id", id, "--log-level", "warn"}
	args = append(append(args, s.linkFlags(clustersec.RoleWorker)...), s.roleFlags(clustersec.RoleWorker)...)
	return stacktest.StartProc(s.t, s.dir, id, env, args...)
}

// waitExit waits for p to exit on its own and returns its log.
func waitExit(t *testing.T, p *proc, within time.Duration) (code int, log string) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(within):
		t.Fatalf("%s still running after %v; log:\n%s", p.Name, within, stacktest.Tail(p.Log))
	}
	b, _ := os.ReadFile(p.Log)
	return p.Cmd.ProcessState.ExitCode(), string(b)
}

// TestSecuredWritePath runs the write path with Kafka TLS+SASL+ACLs, etcd
// client TLS and the mutual TLS gateway↔worker link on: each role with its
// own least-privilege user. A
// message sent over the websocket is accepted and reaches Postgres, and a
// loadgen run's check (as the reader user) passes.
func TestSecuredWritePath(t *testing.T) {
	sharing(t, 20, 22)
	s := startSecured(t)
	s.startRole(clustersec.RoleWorker)
	s.startRole(clustersec.RolePersist)

	alice := s.dev.Dial(t, "alice")
	alice.Must(map[string]any{"op": "create", "conversation_id": "sec", "members": []string{"bob"}})
	r, err := alice.SendRetrying("sec", "m1", "over TLS and SASL")
	if err != nil || r.Op != "accepted" {
		t.Fatalf("send: %+v %v", r, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.dev.EP.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	stacktest.WaitFor(t, 30*time.Second, "the message in Postgres", func() bool {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE conversation_id = 'sec' AND client_message_id = 'm1'`).Scan(&n)
		return err == nil && n == 1
	})

	out := filepath.Join(t.TempDir(), "runs")
	lg := runChatpipe(t, "loadgen", "--endpoints", filepath.Join(s.dev.Dir, "endpoints.json"), "--rate", "30", "--duration", "3s",
		"--out", out, "--run", "secured", "--progress=false", "--drain", "60s")
	if lg.err != nil {
		t.Fatalf("loadgen: %v\n%s", lg.err, lg.out)
	}
	check := runChatpipe(t, append([]string{"check", "--run", filepath.Join(out, "secured")}, s.roleFlags(clustersec.RoleReader)...)...)
	if check.err != nil || !strings.Contains(check.out, "PASS") {
		t.Fatalf("check: %v\n%s", check.err, check.out)
	}
	t.Logf("check:\n%s", check.out)

	// Without credentials the same check is refused with a clear error.
	bare := runChatpipe(t, "check", "--run", filepath.Join(out, "secured"), "--kafka-tls-ca", s.certs.CAFile)
	if bare.err == nil || !strings.Contains(bare.out, "kafka at "+s.broker) {
		t.Fatalf("check without SASL: %v\n%s", bare.err, bare.out)
	}
}

// TestSecuredWrongCredentials: a role given a wrong Kafka password, or no
// client certificate for etcd, exits at start-up with a message naming the
// problem.
func TestSecuredWrongCredentials(t *testing.T) {
	parallel(t)
	s := startSecured(t)
	s.writeSecret("wrong", "not-the-password")
	for _, role := range []string{clustersec.RolePersist, clustersec.RoleWorker} {
		p := stacktest.StartProc(t, s.dir, role+"-wrong", nil, role, "--endpoints", filepath.Join(s.dev.Dir, "endpoints.json"),
			"--kafka-tls-ca", s.certs.CAFile, "--kafka-sasl-mechanism", securedUsers[role], "--kafka-sasl-user", role,
			"--kafka-sasl-password-file", s.secretFile("wrong"), "--etcd-tls-ca", s.certs.CAFile,
			"--etcd-tls-cert", s.certs.ClientCert, "--etcd-tls-key", s.certs.ClientKey)
		code, log := waitExit(t, p, 60*time.Second)
		want := fmt.Sprintf("kafka at %s closed every connection while authenticating (SASL %s as %q over TLS)", s.broker, securedUsers[role], role)
		if code == 0 || !strings.Contains(log, want) {
			t.Fatalf("%s with a wrong password: exit %d, log:\n%s\nwant it to say: %s", role, code, log, want)
		}
		t.Logf("%s with a wrong password: exit %d: %s", role, code, strings.TrimSpace(log))
	}
	// A password file that is not there is named before anything is dialed.
	p := stacktest.StartProc(t, s.dir, "persist-nofile", nil, "persist", "--endpoints", filepath.Join(s.dev.Dir, "endpoints.json"),
		"--kafka-sasl-mechanism", "scram-sha-256", "--kafka-sasl-user", "persist", "--kafka-sasl-password-file", filepath.Join(s.dir, "missing"))
	if code, log := waitExit(t, p, 30*time.Second); code == 0 || !strings.Contains(log, "read password file") {
		t.Fatalf("persist with a missing password file: exit %d, log:\n%s", code, log)
	}
	// The worker with the right Kafka user but no etcd client certificate.
	p = stacktest.StartProc(t, s.dir, "worker-noetcdcert", nil, "worker", "--endpoints", filepath.Join(s.dev.Dir, "endpoints.json"),
		"--kafka-tls-ca", s.certs.CAFile, "--kafka-sasl-mechanism", securedUsers[clustersec.RoleWorker], "--kafka-sasl-user", clustersec.RoleWorker,
		"--kafka-sasl-password-file", s.secretFile(clustersec.RoleWorker), "--etcd-tls-ca", s.certs.CAFile)
	code, log := waitExit(t, p, 60*time.Second)
	if code == 0 || !strings.Contains(log, "etcd") {
		t.Fatalf("worker without an etcd client certificate: exit %d, log:\n%s", code, log)
	}
	t.Logf("worker without an etcd client certificate: exit %d: %s", code, strings.TrimSpace(log))
}

// TestSecuredLeastPrivilege: with the roles' own users, persist cannot
// produce to the log or take a writer's transactional id, and a worker
// cannot read or commit persist's consumer group's offsets, nor join it.
func TestSecuredLeastPrivilege(t *testing.T) {
	parallel(t)
	s := startSecured(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	p := s.roleClient(clustersec.RolePersist, kgo.DefaultProduceTopic(logrecord.DefaultTopic), kgo.RecordDeliveryTimeout(5*time.Second))
	err := p.ProduceSync(ctx, &kgo.Record{Value: []byte("forged")}).FirstErr()
	// The idempotent producer is refused its producer id (no WRITE on any
	// topic, no IDEMPOTENT_WRITE), or the write itself.
	if !errors.Is(err, kerr.TopicAuthorizationFailed) && !errors.Is(err, kerr.ClusterAuthorizationFailed) {
		t.Fatalf("persist produces to the log: %v, want an authorization failure", err)
	}
	t.Logf("persist produces: %v", err)
	pt := s.roleClient(clustersec.RolePersist, kgo.TransactionalID(logrecord.TransactionalID(0)), kgo.DefaultProduceTopic(logrecord.DefaultTopic),
		kgo.RecordDeliveryTimeout(5*time.Second))
	if err := pt.BeginTransaction(); err == nil {
		err = pt.ProduceSync(ctx, &kgo.Record{Value: []byte("forged")}).FirstErr()
		if !errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
			t.Fatalf("persist as a vshard writer: %v, want TRANSACTIONAL_ID_AUTHORIZATION_FAILED", err)
		}
	}

	w := kadm.NewClient(s.roleClient(clustersec.RoleWorker))
	offs := kadm.Offsets{}
	offs.AddOffset(logrecord.DefaultTopic, 0, 0, -1)
	resp, err := w.CommitOffsets(ctx, clustersec.PersistGroup, offs)
	if err == nil {
		err = resp.Error()
	}
	if !errors.Is(err, kerr.GroupAuthorizationFailed) {
		t.Fatalf("worker commits persist's offsets: %v, want GROUP_AUTHORIZATION_FAILED", err)
	}
	fetched, err := w.FetchOffsets(ctx, clustersec.PersistGroup)
	if err == nil {
		err = fetched.Error()
	}
	if !errors.Is(err, kerr.GroupAuthorizationFailed) {
		t.Fatalf("worker reads persist's offsets: %v, want GROUP_AUTHORIZATION_FAILED", err)
	}
	wg := s.roleClient(clustersec.RoleWorker, kgo.ConsumerGroup(clustersec.PersistGroup), kgo.ConsumeTopics(logrecord.DefaultTopic))
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	fs := wg.PollFetches(pctx)
	if err := fs.Err(); !errors.Is(err, kerr.GroupAuthorizationFailed) {
		t.Fatalf("worker joins persist's group: %v, want GROUP_AUTHORIZATION_FAILED", err)
	}
	// Persist's own group is its to use.
	pc := kadm.NewClient(s.roleClient(clustersec.RolePersist))
	if resp, err := pc.CommitOffsets(ctx, clustersec.PersistGroup, offs); err != nil || resp.Error() != nil {
		t.Fatalf("persist commits its own group: %v %v", err, resp.Error())
	}
}
