package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/lease"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version and VCS revision of the build are printed.
var version = ""

func runVersion(_ context.Context, _ []string) error {
	v, goVersion := buildVersion()
	if goVersion != "" {
		v += " " + goVersion
	}
	fmt.Println("chatpipe", v)
	return nil
}

// buildVersion returns the version (main.version, else the module
// version, then the VCS revision if known) and the Go version the binary
// was built with.
func buildVersion() (v, goVersion string) {
	v = version
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				v += " " + s.Value
			}
		}
		goVersion = info.GoVersion
	}
	return v, goVersion
}

// newInitCommand makes chatpipe init, which prepares a deployment once: the
// fixed shape in etcd, the Postgres schema, (with --kafka) the log topic,
// and (with --link-certs) the gateway↔worker link's CA and certificates.
func newInitCommand() *command {
	fs := newFlagSet("init")
	inf := addInfraFlags(fs)
	vshards := fs.Int("vshards", 4096, "virtual shards (fixed for the deployment's life)")
	partitions := fs.Int("partitions", 64, "partitions of the log topic for the hashed vshards (fixed for the deployment's life)")
	dedicated := fs.Int("dedicated", 16, "dedicated vshards for hot conversations, each with a partition of its own after the hashed ones (the topic gets partitions+dedicated)")
	replication := fs.Int("replication-factor", 3, "replication factor of the log topic (-1: the broker's default)")
	minISR := fs.Int("min-insync-replicas", 2, "min.insync.replicas of the log topic (0: the broker's default)")
	linkDir := fs.String("link-certs", "", "directory to make the gateway↔worker link's CA and certificates in, once (DIR/gateway/ and DIR/worker/, each ca.pem, cert.pem, key.pem); kept if already complete. Alone (no --etcd, --database-url) it does only this")
	linkValid := fs.Duration("link-certs-validity", 2*365*24*time.Hour, "validity of the link CA and certificates --link-certs makes")
	retention := fs.Duration("retention", -1, "retention.ms of the log topic; negative keeps it forever (the log is the source of truth: replay and rebuild read it)")
	fs.check(atLeast("vshards", 1), atLeast("partitions", 1), notNegative("dedicated"), notNegative("min-insync-replicas"), positive("link-certs-validity"),
		func(fs *flag.FlagSet) error {
			if *replication == 0 || *replication < -1 {
				return rangeError(fs.Lookup("replication-factor"), "at least 1, or -1 for the broker's default")
			}
			return nil
		})
	level, format := logFlags(fs)
	return newCommand(fs, "prepare a deployment once: its shape in etcd, the Postgres schema, the topic", func(ctx context.Context, _ []string) error {
		log, err := inf.setup(level, format)
		if err != nil {
			return err
		}
		if *linkDir != "" {
			created, err := clustersec.WriteLinkCerts(*linkDir, *linkValid)
			if err != nil {
				return err
			}
			if created {
				log.Info("link certificates made", "dir", *linkDir, "valid", linkValid.String())
			} else {
				log.Info("link certificates kept", "dir", *linkDir)
			}
			if *inf.etcd == "" && *inf.dbURL == "" {
				return nil
			}
		}
		if *inf.etcd == "" || *inf.dbURL == "" {
			return errors.New("need --etcd and --database-url (and --kafka to create the topic)")
		}
		var kopts []kgo.Opt
		if *inf.kafka != "" {
			if kopts, err = inf.kafkaOpts(ctx); err != nil {
				return err
			}
		}
		cli, cfg, err := etcdConfig(ctx, *inf.etcd, inf.sec, lease.Config{VShards: *vshards, Partitions: *partitions, Topic: *inf.topic, Dedicated: *dedicated})
		if err != nil {
			return err
		}
		defer cli.Close()
		db, err := openMigratedDB(ctx, *inf.dbURL)
		if err != nil {
			return err
		}
		defer db.Close()
		if *inf.kafka != "" {
			spec := devstack.TopicSpec{Partitions: cfg.Layout().TopicPartitions(), Replication: int16(*replication), Configs: devstack.KeptForever()}
			if *retention >= 0 {
				spec.Configs["retention.ms"] = strconv.FormatInt(retention.Milliseconds(), 10)
			}
			if *minISR > 0 {
				spec.Configs["min.insync.replicas"] = strconv.Itoa(*minISR)
			}
			if err := devstack.EnsureTopicSpec(ctx, splitList(*inf.kafka), cfg.Topic, spec, kopts...); err != nil {
				return err
			}
		}
		log.Info("deployment ready", "vshards", cfg.VShards, "partitions", cfg.Partitions, "dedicated", cfg.Dedicated, "topic", cfg.Topic)
		return nil
	})
}
