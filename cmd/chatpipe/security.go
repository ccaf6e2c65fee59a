package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/link"
)

// secFlags are the TLS and SASL flags of every command that talks to Kafka
// or etcd. Secrets are named by file, never given as values.
type secFlags struct {
	kafka clustersec.Kafka
	etcd  clustersec.TLS

	kopts  []kgo.Opt // built once by kafkaOpts
	probed bool
}

func addSecFlags(fs *flagSet) *secFlags {
	s := &secFlags{}
	k := &s.kafka
	fs.BoolVar(&k.TLS.Enabled, "kafka-tls", false, "talk TLS to Kafka (implied by any --kafka-tls-* flag); trusts the system roots unless --kafka-tls-ca")
	fs.StringVar(&k.TLS.CAFile, "kafka-tls-ca", "", "PEM file of the CAs that sign the brokers' certificates")
	fs.StringVar(&k.TLS.CertFile, "kafka-tls-cert", "", "PEM client certificate for brokers that want one (with --kafka-tls-key)")
	fs.StringVar(&k.TLS.KeyFile, "kafka-tls-key", "", "PEM key of --kafka-tls-cert")
	fs.StringVar(&k.TLS.ServerName, "kafka-tls-server-name", "", "name the brokers' certificates must carry (default: the host dialed)")
	fs.StringVar(&k.SASLMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: plain, scram-sha-256, scram-sha-512 or oauthbearer (default: no SASL)")
	fs.StringVar(&k.SASLUser, "kafka-sasl-user", "", "SASL user (plain, scram)")
	fs.StringVar(&k.SASLPasswordFile, "kafka-sasl-password-file", "", "file holding the SASL password (plain, scram)")
	fs.StringVar(&k.SASLTokenFile, "kafka-sasl-token-file", "", "file holding the OAUTHBEARER token, read again at every authentication")
	fs.StringVar(&s.etcd.CAFile, "etcd-tls-ca", "", "PEM file of the CAs that sign the etcd members' certificates (use https:// endpoints)")
	fs.StringVar(&s.etcd.CertFile, "etcd-tls-cert", "", "PEM client certificate for etcd (with --etcd-tls-key)")
	fs.StringVar(&s.etcd.KeyFile, "etcd-tls-key", "", "PEM key of --etcd-tls-cert")
	fs.StringVar(&s.etcd.ServerName, "etcd-tls-server-name", "", "name the etcd members' certificates must carry (default: the host dialed)")
	return s
}

// kafkaOpts returns the options to append to every Kafka client. With TLS
// or SASL configured, the first call also checks them against brokers and
// fails with a message naming the problem if the brokers refuse them.
func (s *secFlags) kafkaOpts(ctx context.Context, brokers []string) ([]kgo.Opt, error) {
	if s.kopts == nil {
		opts, err := s.kafka.Opts()
		if err != nil {
			return nil, err
		}
		s.kopts = append([]kgo.Opt{}, opts...)
	}
	if !s.probed && s.kafka.On() && len(brokers) > 0 {
		s.probed = true
		if err := clustersec.Probe(ctx, brokers, s.kopts, s.kafka.String()); err != nil {
			return nil, err
		}
	}
	return s.kopts, nil
}

// etcdTLS returns the etcd client's TLS config, nil for plaintext.
func (s *secFlags) etcdTLS() (*tls.Config, error) {
	c, err := s.etcd.Config()
	if err != nil {
		return nil, fmt.Errorf("etcd %w", err)
	}
	return c, nil
}

// errEmbeddedSecured is returned by dev when Kafka security flags are given
// without --kafka: the embedded broker speaks plaintext only.
var errEmbeddedSecured = errors.New("the embedded Kafka broker is plaintext without SASL: --kafka-tls* and --kafka-sasl-* need --kafka")

// linkFlags are the gateway↔worker link's mutual TLS flags, of the
// commands that run either end (gateway, worker, dev). The worker also has
// --link-insecure. The check run at parse loads the files, so a missing
// file, a certificate of the wrong role or a plaintext worker on a
// non-loopback address fails at start (and in admin check-config).
type linkFlags struct {
	ca, cert, key *string
	insecure      *bool
	creds         *link.TLS // set by the check when the link is TLS
}

func addLinkFlags(fs *flagSet) *linkFlags {
	l := &linkFlags{
		ca:   fs.String("link-tls-ca", "", "PEM file of the link CA(s): the gateway↔worker link is mutual TLS 1.3 with --link-tls-cert and --link-tls-key (chatpipe init --link-certs makes them)"),
		cert: fs.String("link-tls-cert", "", "PEM certificate of this end of the gateway↔worker link: a gateway's names "+link.GatewayID+", a worker's "+link.WorkerID),
		key:  fs.String("link-tls-key", "", "PEM key of --link-tls-cert"),
	}
	if fs.Name() == "worker" {
		l.insecure = fs.Bool("link-insecure", false, "serve gateways in plaintext on a non-loopback --listen address: anyone who reaches it can write as any user (without it, such a worker needs --link-tls-*); with --link-tls-*, take both TLS and plaintext links, while a deployment turns TLS on")
	}
	fs.check(l.check)
	return l
}

// check validates the flags and loads the credentials.
func (l *linkFlags) check(fs *flag.FlagSet) error {
	set := map[string]bool{"link-tls-ca": *l.ca != "", "link-tls-cert": *l.cert != "", "link-tls-key": *l.key != ""}
	var missing []string
	for _, n := range []string{"link-tls-ca", "link-tls-cert", "link-tls-key"} {
		if !set[n] {
			missing = append(missing, "--"+n)
		}
	}
	insecure := l.insecure != nil && *l.insecure
	if len(missing) == 3 {
		if fs.Name() == "worker" && !insecure {
			if listen := fs.Lookup("listen").Value.String(); !loopbackAddr(listen) {
				return fmt.Errorf("the worker would serve gateways in plaintext on --listen %s, which is not a loopback address: anyone reaching it could write as any user; give it --link-tls-ca, --link-tls-cert and --link-tls-key (chatpipe init --link-certs makes them), or --link-insecure on a network only gateways reach", listen)
			}
		}
		return nil
	}
	if len(missing) > 0 {
		return fmt.Errorf("the link's mutual TLS needs --link-tls-ca, --link-tls-cert and --link-tls-key: %s missing", strings.Join(missing, ", "))
	}
	creds, err := link.LoadTLS(*l.ca, *l.cert, *l.key)
	if err != nil {
		return err
	}
	want := link.GatewayID
	if fs.Name() == "worker" {
		want = link.WorkerID
	}
	if got := creds.Role(); got != want {
		if got == "" {
			got = "no link role"
		}
		return fmt.Errorf("--link-tls-cert %s names %s: chatpipe %s needs a certificate naming %s", *l.cert, got, fs.Name(), want)
	}
	if w := fs.Lookup("workers"); fs.Name() == "dev" && w != nil && w.Value.String() != "0" {
		return errors.New("chatpipe dev runs its workers in this process on loopback: --link-tls-* is for its gateway alone, with --workers 0 and workers started by chatpipe worker")
	}
	if na := creds.NotAfter(); time.Now().After(na) {
		return fmt.Errorf("--link-tls-cert %s expired at %s", *l.cert, na.UTC().Format(time.RFC3339))
	}
	l.creds = creds
	return nil
}

// apply sets the link's TLS in c: the credentials, and with
// --link-insecure as well plaintext links too (while a deployment turns TLS
// on).
func (l *linkFlags) apply(c *link.Config) {
	c.TLS = l.creds
	c.AllowPlaintext = l.creds != nil && l.insecure != nil && *l.insecure
}

// loopbackAddr reports whether a listen address (host:port) takes
// connections from this machine only: a loopback IP or "localhost". An
// empty host (every interface) or any other name is not.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
