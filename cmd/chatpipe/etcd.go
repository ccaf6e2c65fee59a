package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/chatpipe/chatpipe/internal/devstack"
)

// newEtcdCommand makes chatpipe etcd, which runs one member of a static
// etcd cluster on 127.0.0.1 until SIGINT or SIGTERM: `chatpipe etcd
// --data-dir DIR --name NAME --client-port P --peer-port Q
// --initial-cluster name1=http://127.0.0.1:Q1,...`. It is for fault tests
// and multi-process setups on one machine (production runs a real etcd
// cluster); `chatpipe dev --etcd` and the roles' --etcd take the members'
// client URLs.
//
// Start every member of a new cluster with the same --initial-cluster; each
// waits for a quorum before it is ready, then prints its client URL on
// stdout. A restart on the same data dir rejoins the cluster from its data
// (--initial-cluster is then ignored), and must keep the same --peer-port.
func newEtcdCommand() *command {
	fs := newFlagSet("etcd")
	dataDir := fs.String("data-dir", "chatpipe-etcd", "directory the member keeps its data in; a restart on it rejoins the cluster")
	name := fs.String("name", "etcd1", "member name, unique in the cluster and listed in --initial-cluster")
	clientPort := fs.Int("client-port", 2379, "client port on 127.0.0.1 (0: a free one)")
	peerPort := fs.Int("peer-port", 2380, "peer port on 127.0.0.1; part of the cluster membership, so keep it across restarts")
	initialCluster := fs.String("initial-cluster", "", "every member as name=http://127.0.0.1:PEER_PORT, comma separated, the same for all members (default: this member alone)")
	fs.check(portCheck("client-port", true), portCheck("peer-port", false))
	level, format := logFlags(fs)
	return newCommand(fs, "run one member of a static etcd cluster on 127.0.0.1 (fault tests, multi-process setups)", func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("unexpected arguments %q", args)
		}
		log, err := newLogger(*level, *format)
		if err != nil {
			return err
		}
		log.Info("etcd member starting; waiting for a quorum of the cluster", "name", *name, "data_dir", *dataDir,
			"client_port", *clientPort, "peer_port", *peerPort, "initial_cluster", *initialCluster)
		e, err := devstack.StartEtcdMember(ctx, *dataDir, *name, *clientPort, *peerPort, *initialCluster, log)
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped before the cluster came up
			}
			return err
		}
		defer e.Close()
		fmt.Println(strings.Join(e.Endpoints(), ","))
		log.Info("etcd member ready", "name", *name, "endpoints", e.Endpoints())
		select {
		case <-ctx.Done():
			log.Info("etcd member stopping", "name", *name)
			return nil
		case <-e.Done():
			return errors.New("etcd member stopped on its own (see the log above)")
		}
	})
}
