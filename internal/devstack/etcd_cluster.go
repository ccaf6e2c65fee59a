package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"

	"go.etcd.io/etcd/client/pkg/v3/types"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// etcdClusterToken is the initial cluster token of every member started by
// StartEtcdMember. Members only form a cluster with members that were
// bootstrapped with the same token and the same initial cluster.
const etcdClusterToken = "chatpipe-devstack"

// StartEtcdMember starts (or restarts, keeping data) one member of a static
// etcd cluster whose data lives in dir. It is for fault tests and
// multi-process setups on one machine: run one member per process, e.g. with
// `chatpipe etcd`.
//
// initialCluster lists every member as name=http://127.0.0.1:PEER_PORT,
// comma separated, the way etcd's --initial-cluster does; it must name this
// member with peer URL http://127.0.0.1:peerPort. Empty means a cluster of
// this member alone. The member listens on 127.0.0.1 only: peer traffic on
// peerPort, clients on clientPort (0 = pick a free one).
//
// The first start on an empty dir bootstraps the member (cluster state
// "new"); every member of the initial cluster must be started with the same
// initialCluster. A restart on the same dir rejoins the cluster from its
// data: the initial cluster is then ignored. The peer URL is part of the
// cluster's membership, so a restart must use the same peerPort (a different
// one is logged as a warning; the other members would not reach it).
//
// StartEtcdMember returns once the member is ready to serve, which needs a
// quorum of the cluster: starting the first member of a three-member
// cluster, or restarting a member while a majority is down, waits for the
// other members. There is no built-in timeout; bound the wait with ctx. It
// also returns with an error when the server fails to start. Two members
// cannot run on the same dir at once: the second start fails immediately.
// etcd's own logging goes to log at warn level and above.
func StartEtcdMember(ctx context.Context, dir, name string, clientPort, peerPort int, initialCluster string, log *slog.Logger) (*Etcd, error) {
	log = orDefault(log).With("component", "etcd", "member", name)
	if dir == "" {
		return nil, errors.New("devstack: start etcd member: empty data dir")
	}
	if name == "" {
		return nil, errors.New("devstack: start etcd member: empty member name")
	}
	if peerPort <= 0 || peerPort > 65535 {
		return nil, fmt.Errorf("devstack: start etcd member %s: peer port %d out of range (it is part of the cluster membership, so it cannot be picked automatically)", name, peerPort)
	}
	if clientPort < 0 || clientPort > 65535 {
		return nil, fmt.Errorf("devstack: start etcd member %s: client port %d out of range", name, clientPort)
	}
	purl := clientURL(peerPort)
	cluster, err := memberInitialCluster(name, purl, initialCluster)
	if err != nil {
		return nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("devstack: start etcd member %s: %w", name, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devstack: start etcd member %s: create data dir: %w", name, err)
	}
	// etcd wants its data dir private (and warns otherwise).
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devstack: start etcd member %s: make data dir private: %w", name, err)
	}
	lock, err := lockDir(dir, etcdLockFile, "etcd")
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		cport := clientPort
		if cport == 0 {
			if cport, err = FreePort(); err != nil {
				_ = lock.Close()
				return nil, fmt.Errorf("devstack: start etcd member %s: %w", name, err)
			}
		}
		quiet := new(atomic.Bool)
		ee, err := startEtcdMember(ctx, dir, name, cport, purl, cluster, log, quiet)
		if err == nil {
			e := newEtcd(ee, lock, cport, peerPort, log, quiet)
			log.Debug("etcd member ready", "dir", dir, "endpoints", e.endpoints, "peer_port", peerPort)
			return e, nil
		}
		// Only a client port we picked ourselves can be picked again.
		if clientPort == 0 && isAddrInUse(err) && attempt < etcdStartAttempts && ctx.Err() == nil && portFree(peerPort) {
			log.Warn("etcd client port taken, retrying", "attempt", attempt, "err", err)
			continue
		}
		_ = lock.Close()
		return nil, err
	}
}

// memberInitialCluster checks initialCluster (empty: this member alone)
// and returns it in etcd's canonical form.
func memberInitialCluster(name string, peerURL *url.URL, initialCluster string) (string, error) {
	if initialCluster == "" {
		initialCluster = name + "=" + peerURL.String()
	}
	m, err := types.NewURLsMap(initialCluster)
	if err != nil {
		return "", fmt.Errorf("devstack: etcd initial cluster %q: %w", initialCluster, err)
	}
	own, ok := m[name]
	if !ok {
		names := make([]string, 0, len(m))
		for n := range m {
			names = append(names, n)
		}
		sort.Strings(names)
		return "", fmt.Errorf("devstack: etcd initial cluster %q does not name member %s (it names %v)", initialCluster, name, names)
	}
	if !slices.Equal(own.StringSlice(), []string{peerURL.String()}) {
		return "", fmt.Errorf("devstack: etcd initial cluster gives member %s peer URLs %v, but it listens on %s", name, own.StringSlice(), peerURL)
	}
	return m.String(), nil
}

// startEtcdMember starts the embedded server of one cluster member and waits
// until it is ready. On error nothing is left running.
func startEtcdMember(ctx context.Context, dir, name string, clientPort int, purl *url.URL, initialCluster string, log *slog.Logger, quiet *atomic.Bool) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	curl := clientURL(clientPort)
	cfg.ListenClientUrls = []url.URL{*curl}
	cfg.AdvertiseClientUrls = []url.URL{*curl}
	cfg.ListenPeerUrls = []url.URL{*purl}
	cfg.AdvertisePeerUrls = []url.URL{*purl}
	// Only used when the member is first created; an existing WAL wins, so
	// a restart rejoins the cluster it belongs to.
	cfg.InitialCluster = initialCluster
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.InitialClusterToken = etcdClusterToken
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(newSlogZapCore(log, zap.WarnLevel, etcdBenignWarnings, quiet)))

	ee, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("devstack: start etcd member %s in %s (client port %d, peer URL %s): %w", name, dir, clientPort, purl, err)
	}
	fail := func() { quiet.Store(true); ee.Close() }
	// A restarted member knows its peer URL from its data, not from the
	// flags: say so if they differ, since the member will then wait for a
	// quorum that cannot reach it.
	srv := ee.Server
	if m := srv.Cluster().Member(srv.MemberID()); m != nil && !slices.Equal(m.PeerURLs, []string{purl.String()}) {
		log.Warn("etcd member was created with other peer URLs; the other members will not reach it on the new one",
			"recorded", m.PeerURLs, "listening", purl.String())
	}
	select {
	case <-srv.ReadyNotify():
		return ee, nil
	case err := <-ee.Err():
		fail()
		return nil, fmt.Errorf("devstack: etcd member %s in %s failed while starting: %w", name, dir, err)
	case <-srv.StopNotify():
		fail()
		return nil, fmt.Errorf("devstack: etcd member %s in %s stopped while starting", name, dir)
	case <-ctx.Done():
		fail()
		return nil, fmt.Errorf("devstack: wait for etcd member %s in %s to be ready (it needs a quorum of its cluster): %w", name, dir, context.Cause(ctx))
	}
}

// Done is closed when the server has stopped, whether through Close or on
// its own (a fatal error, or the member was removed from its cluster).
func (e *Etcd) Done() <-chan struct{} {
	return e.e.Server.StopNotify()
}

// PeerPort returns the port the member's peer URL uses.
func (e *Etcd) PeerPort() int { return e.peerPort }
