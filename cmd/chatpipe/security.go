package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/clientsec"
)

// secFlags are the TLS and SASL flags of every command that talks to Kafka
// or etcd. Secrets are named by file, never given as values.
type secFlags struct {
	kafka clientsec.Kafka
	etcd  clientsec.TLS

	kopts  []kgo.Opt // built once by kafkaOpts
	probed bool
}

func addSecFlags(fs *flag.FlagSet) *secFlags {
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
		if err := clientsec.Probe(ctx, brokers, s.kopts, s.kafka.String()); err != nil {
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
