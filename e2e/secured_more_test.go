package e2e

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/clustersec"
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
	s.dev.ep.kafkaOpts = s.kafkaOpts(clustersec.RoleReader, securedUsers[clustersec.RoleReader], "pw-"+clustersec.RoleReader)
	etls, err := clustersec.TLS{CAFile: s.certs.CAFile, CertFile: s.certs.ClientCert, KeyFile: s.certs.ClientKey}.Config()
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
	args = append(append(args, s.linkFlags(clustersec.RoleWorker)...), s.roleFlags(clustersec.RoleWorker)...)
	return startProc(s.t, s.dir, id, env, args...)
}

// TestSecuredPausedWriterIsFenced is TestPausedWriterIsFenced in the
// secured mode: the workers' transactional ids are theirs by ACL, and the
// new owner's fencing of the paused one goes through the same broker
// checks; persist and projection run with their own users.
func TestSecuredPausedWriterIsFenced(t *testing.T) {
	parallel(t)
	s := startSecuredForChecks(t)
	s.startRole(clustersec.RolePersist)
	s.startRole(clustersec.RoleProjection)
	accepted, fenced := pausedWriterOn(t, s.dev, s.startWorker)
	checkPausedWriterFenced(t, s.dev, accepted, fenced)
}

// TestSecuredDeliveryConverges is TestDeliveryConverges in the secured
// mode: pushes to devices and sync over a gateway whose link to the worker
// is mutual TLS, from a projection and persist reading with their own
// users. The gateway and the worker export the time left on their link
// certificates (made valid for 24 h).
func TestSecuredDeliveryConverges(t *testing.T) {
	s := startSecuredForChecks(t)
	s.startWorker("w1")
	s.startRole(clustersec.RolePersist)
	s.startRole(clustersec.RoleProjection)
	waitFor(t, 60*time.Second, "w1 to register", func() bool { _, ok := etcdView(t, s.dev.ep).Workers["w1"]; return ok })
	for role, url := range map[string]string{"gateway": s.dev.ep.Admin + "/metrics", "worker": adminURL(t, s.dev.ep, "w1")} {
		left := time.Duration(metric(t, url, `chatpipe_link_cert_expiry_seconds{role="`+role+`"}`) * float64(time.Second))
		if left < 23*time.Hour || left > 24*time.Hour {
			t.Errorf("the %s's chatpipe_link_cert_expiry_seconds says %v left, want just under 24h", role, left)
		}
	}
	deliveryConverges(t, s.dev)
}

// linkTLSGatewayMetrics returns the metric names of a `chatpipe gateway`
// on dev's stack whose link is mutual TLS (certificates from `chatpipe
// init --link-certs`): what a gateway exports only then, such as
// chatpipe_link_cert_expiry_seconds.
func linkTLSGatewayMetrics(t *testing.T, dev *devProc) map[string]bool {
	t.Helper()
	link := filepath.Join(t.TempDir(), "link")
	if r := runChatpipe(t, "init", "--link-certs", link); r.err != nil {
		t.Fatalf("init --link-certs: %v\n%s", r.err, r.out)
	}
	f := clustersec.LinkDir(link, clustersec.RoleGateway)
	port, adminPort := freePort(t), freePort(t)
	startProc(t, dev.dir, "gateway-link-tls", nil, "gateway", "--endpoints", filepath.Join(dev.dir, "endpoints.json"),
		"--data-dir", dev.dir, "--http", "127.0.0.1:"+strconv.Itoa(port), "--admin", "127.0.0.1:"+strconv.Itoa(adminPort), "--log-level", "warn",
		"--link-tls-ca", f.CA, "--link-tls-cert", f.Cert, "--link-tls-key", f.Key)
	waitFor(t, 60*time.Second, "the link TLS gateway to listen", func() bool { return dialable(port) && dialable(adminPort) })
	return exportedMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", adminPort))
}
