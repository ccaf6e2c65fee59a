package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	"go.uber.org/zap"

	"github.com/chatpipe/chatpipe/internal/atomicfile"
)

const (
	// etcdStateFile remembers the peer port of the member living in a dir.
	etcdStateFile = "devstack-etcd.json"
	// etcdLockFile guards a dir against two embedded members at once.
	etcdLockFile = "devstack-etcd.lock"
	// etcdMemberName is the name of the single member.
	etcdMemberName = "devstack"
	// etcdStartTimeout bounds StartEtcd when ctx has a later (or no) deadline.
	etcdStartTimeout = 2 * time.Minute
	// etcdStartAttempts is how often StartEtcd tries again after losing a
	// race for a port it picked itself.
	etcdStartAttempts = 3
)

// etcdBenignWarnings are warnings etcd logs on every start of a local,
// insecure, single-member server; they are logged at debug level.
var etcdBenignWarnings = []string{
	"Running http and grpc server on single port. This is not recommended for production.",
	"simple token is not cryptographically signed",
}

// etcdState is the content of etcdStateFile.
type etcdState struct {
	// PeerPort is the port the member's peer URL uses.
	PeerPort int `json:"peer_port"`
}

// Etcd is an embedded etcd member (go.etcd.io/etcd/server/v3/embed): a
// single-member server (StartEtcd) or one member of a static cluster
// (StartEtcdMember).
//
// Its data lives in the directory given to StartEtcd; stop it with Close.
type Etcd struct {
	e         *embed.Etcd
	lock      *os.File
	endpoints []string
	peerPort  int
	log       *slog.Logger
	quiet     *atomic.Bool // demotes etcd's shutdown noise, see slogZapCore

	closeOnce sync.Once
}

// newEtcd wraps a started member listening for clients on cport.
func newEtcd(ee *embed.Etcd, lock *os.File, cport, peerPort int, log *slog.Logger, quiet *atomic.Bool) *Etcd {
	return &Etcd{e: ee, lock: lock, endpoints: []string{clientURL(cport).String()}, peerPort: peerPort, log: log, quiet: quiet}
}

// EtcdTLS is the server side of client TLS for StartEtcdTLS: the member's
// certificate and key, and the CA whose client certificates it accepts
// (every client must present one).
type EtcdTLS struct {
	CertFile, KeyFile, CAFile string
}

// StartEtcdTLS is StartEtcd with the client port serving TLS and requiring
// client certificates signed by t.CAFile; Endpoints then returns https URLs.
// Peers still talk plaintext (a single member has none).
func StartEtcdTLS(ctx context.Context, dir string, clientPort int, log *slog.Logger, t EtcdTLS) (*Etcd, error) {
	return startEtcd(ctx, dir, clientPort, log, &t)
}

// StartEtcd starts (or restarts, keeping data) an embedded etcd member whose
// data lives in dir.
//
// The member listens on 127.0.0.1 only; the client port is clientPort (0 =
// pick a free one). The peer port is chosen once and remembered in dir (a
// small JSON file written atomically) so that a restart on the same dir
// reuses it. If the remembered port is taken, another one is picked and
// remembered instead; etcd still starts on the existing data, and the
// member's recorded peer URL is updated to match. etcd's own logging goes to
// log at warn level and above.
//
// StartEtcd returns once the server is ready to serve, or with an error when
// ctx is done, a two minute start timeout passes, or the server fails. Two
// members cannot run on the same dir at once: the second StartEtcd fails
// immediately.
func StartEtcd(ctx context.Context, dir string, clientPort int, log *slog.Logger) (*Etcd, error) {
	return startEtcd(ctx, dir, clientPort, log, nil)
}

// startEtcd is StartEtcd, with client TLS if t is set.
func startEtcd(ctx context.Context, dir string, clientPort int, log *slog.Logger, t *EtcdTLS) (*Etcd, error) {
	log = orDefault(log).With("component", "etcd")
	if dir == "" {
		return nil, errors.New("devstack: start etcd: empty data dir")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("devstack: start etcd: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devstack: start etcd: create data dir: %w", err)
	}
	// etcd wants its data dir private (and warns otherwise); MkdirAll
	// leaves an existing dir's mode alone.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devstack: start etcd: make data dir private: %w", err)
	}
	lock, err := lockDir(dir, etcdLockFile, "etcd")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, etcdStartTimeout)
	defer cancel()

	for attempt := 1; ; attempt++ {
		peerPort, err := chooseEtcdPeerPort(dir, log)
		if err != nil {
			_ = lock.Close()
			return nil, err
		}
		cport := clientPort
		if cport == 0 {
			if cport, err = FreePort(); err != nil {
				_ = lock.Close()
				return nil, fmt.Errorf("devstack: start etcd: %w", err)
			}
		}
		quiet := new(atomic.Bool)
		ee, err := startEmbedEtcd(ctx, dir, cport, peerPort, log, quiet, t)
		if err == nil {
			e := newEtcd(ee, lock, cport, peerPort, log, quiet)
			if t != nil {
				e.endpoints = []string{clientTLSURL(cport).String()}
			}
			log.Debug("etcd ready", "dir", dir, "endpoints", e.endpoints, "peer_port", peerPort)
			return e, nil
		}
		// We lost a race for a port we picked (the client port, or a
		// remembered peer port grabbed between our check and etcd's bind).
		// chooseEtcdPeerPort moves the peer port if it is still taken.
		if isAddrInUse(err) && attempt < etcdStartAttempts && ctx.Err() == nil &&
			(clientPort == 0 || !portFree(peerPort)) {
			log.Warn("etcd port taken, retrying", "attempt", attempt, "err", err)
			continue
		}
		_ = lock.Close()
		return nil, err
	}
}

// chooseEtcdPeerPort returns the peer port remembered in dir if it is free,
// and otherwise picks a free port and remembers it.
func chooseEtcdPeerPort(dir string, log *slog.Logger) (int, error) {
	path := filepath.Join(dir, etcdStateFile)
	var st etcdState
	found, err := readJSON(path, &st)
	if err != nil {
		return 0, err
	}
	if found && st.PeerPort > 0 && st.PeerPort < 65536 {
		if portFree(st.PeerPort) {
			return st.PeerPort, nil
		}
		log.Warn("remembered etcd peer port is taken, picking another", "old_peer_port", st.PeerPort)
	}
	port, err := FreePort()
	if err != nil {
		return 0, fmt.Errorf("devstack: choose etcd peer port: %w", err)
	}
	if err := atomicfile.WriteJSON(path, etcdState{PeerPort: port}, 0o644); err != nil {
		return 0, fmt.Errorf("devstack: remember etcd peer port: %w", err)
	}
	return port, nil
}

func clientURL(port int) *url.URL {
	return &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(port)}
}

// clientTLSURL is clientURL for a member serving client TLS.
func clientTLSURL(port int) *url.URL {
	u := clientURL(port)
	u.Scheme = "https"
	return u
}

// startEmbedEtcd starts the embedded server and waits for it to be ready.
// With t set its client port serves TLS and wants client certificates. On
// error nothing is left running.
func startEmbedEtcd(ctx context.Context, dir string, clientPort, peerPort int, log *slog.Logger, quiet *atomic.Bool, t *EtcdTLS) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = etcdMemberName
	cfg.Dir = dir
	curl, purl := clientURL(clientPort), clientURL(peerPort)
	if t != nil {
		curl = clientTLSURL(clientPort)
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.CAFile, ClientCertAuth: true}
	}
	cfg.ListenClientUrls = []url.URL{*curl}
	cfg.AdvertiseClientUrls = []url.URL{*curl}
	cfg.ListenPeerUrls = []url.URL{*purl}
	cfg.AdvertisePeerUrls = []url.URL{*purl}
	// Only used when the member is first created; an existing WAL wins.
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.InitialClusterToken = "devstack"
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(newSlogZapCore(log, zap.WarnLevel, etcdBenignWarnings, quiet)))

	ee, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("devstack: start etcd in %s (client port %d, peer port %d): %w", dir, clientPort, peerPort, err)
	}
	fail := func() { quiet.Store(true); ee.Close() }
	select {
	case <-ee.Server.ReadyNotify():
	case err := <-ee.Err():
		fail()
		return nil, fmt.Errorf("devstack: etcd in %s failed while starting: %w", dir, err)
	case <-ee.Server.StopNotify():
		fail()
		return nil, fmt.Errorf("devstack: etcd in %s stopped while starting", dir)
	case <-ctx.Done():
		fail()
		return nil, fmt.Errorf("devstack: wait for etcd in %s to be ready: %w", dir, context.Cause(ctx))
	}
	if err := syncEtcdPeerURL(ctx, ee, purl.String(), log); err != nil {
		fail()
		return nil, err
	}
	return ee, nil
}

// syncEtcdPeerURL makes the member's peer URL in the cluster membership match
// the one it now listens on. A restarted member keeps the membership from
// its WAL, so after a peer-port change the stored URL would be stale. With a
// single member nothing dials it, but keeping it accurate avoids surprises
// for tools that read the member list.
func syncEtcdPeerURL(ctx context.Context, ee *embed.Etcd, peerURL string, log *slog.Logger) error {
	srv := ee.Server
	m := srv.Cluster().Member(srv.MemberID())
	if m == nil {
		return fmt.Errorf("devstack: etcd member %s missing from its own cluster", srv.MemberID())
	}
	if len(m.PeerURLs) == 1 && m.PeerURLs[0] == peerURL {
		return nil
	}
	log.Info("updating etcd member peer URL", "old", m.PeerURLs, "new", peerURL)
	upd := membership.Member{
		ID: m.ID,
		RaftAttributes: membership.RaftAttributes{
			PeerURLs:  []string{peerURL},
			IsLearner: m.IsLearner,
		},
	}
	if _, err := srv.UpdateMember(ctx, upd); err != nil {
		return fmt.Errorf("devstack: update etcd member peer URL to %s: %w", peerURL, err)
	}
	return nil
}

// Endpoints returns the client URLs of the member, e.g.
// []string{"http://127.0.0.1:PORT"}.
func (e *Etcd) Endpoints() []string {
	return append([]string(nil), e.endpoints...)
}

// Close stops the server and releases its data dir. It is safe to call more
// than once; later calls do nothing.
func (e *Etcd) Close() error {
	e.closeOnce.Do(func() {
		e.quiet.Store(true)
		e.e.Close()
		_ = e.lock.Close()
		e.log.Debug("etcd stopped")
	})
	return nil
}
