package e2e

import (
	"path/filepath"
	"testing"

	"github.com/chatpipe/chatpipe/clientsec"
)

// The paused-writer and delivery scenarios in the secured mode: Kafka
// TLS+SASL+ACLs with each role's own user, etcd client TLS and the mutual
// TLS gateway↔worker link (startSecured), the same bodies as
// TestPausedWriterIsFenced and TestDeliveryConverges.

// startSecuredForChecks starts the secured stack and gives the test's own
// clients what they need against it: the reader's Kafka credentials (the
// world checks read the committed log) and an etcd client certificate (the
// tests read the owner rows).
func startSecuredForChecks(t *testing.T) *securedStack {
	t.Helper()
	s := startSecured(t)
	s.dev.ep.kafkaOpts = s.kafkaOpts(clientsec.RoleReader, securedUsers[clientsec.RoleReader], "pw-"+clientsec.RoleReader)
	etls, err := clientsec.TLS{CAFile: s.certs.CAFile, CertFile: s.certs.ClientCert, KeyFile: s.certs.ClientKey}.Config()
	if err != nil {
		t.Fatal(err)
	}
	s.dev.ep.etcdTLS = etls
	return s
}

// startWorker runs `chatpipe worker` as id with the worker's Kafka user,
// etcd client certificate and link certificate, and env.
func (s *securedStack) startWorker(id string, env ...string) *proc {
	args := []string{"worker", "--endpoints", filepath.Join(s.dev.dir, "endpoints.json"), "--id", id, "--log-level", "warn"}
	args = append(append(args, s.linkFlags(clientsec.RoleWorker)...), s.roleFlags(clientsec.RoleWorker)...)
	return startProc(s.t, s.dir, id, env, args...)
}

// TestSecuredPausedWriterIsFenced is TestPausedWriterIsFenced in the
// secured mode: the workers' transactional ids are theirs by ACL, and the
// new owner's fencing of the paused one goes through the same broker
// checks; persist and projection run with their own users.
func TestSecuredPausedWriterIsFenced(t *testing.T) {
	s := startSecuredForChecks(t)
	s.startRole(clientsec.RolePersist)
	s.startRole(clientsec.RoleProjection)
	accepted, fenced := pausedWriterOn(t, s.dev, s.startWorker)
	checkPausedWriterFenced(t, s.dev, accepted, fenced)
}

// TestSecuredDeliveryConverges is TestDeliveryConverges in the secured
// mode: pushes to devices and sync over a gateway whose link to the worker
// is mutual TLS, from a projection and persist reading with their own
// users.
func TestSecuredDeliveryConverges(t *testing.T) {
	s := startSecuredForChecks(t)
	s.startWorker("w1")
	s.startRole(clientsec.RolePersist)
	s.startRole(clientsec.RoleProjection)
	deliveryConverges(t, s.dev)
}
