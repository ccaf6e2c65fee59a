// Package clustersec owns how chatpipe's Kafka and etcd clients authenticate:
// TLS (a CA to trust, an optional client certificate, a server name) for
// both, and SASL (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER) for Kafka. Secrets
// are read from files, never taken as values, so they do not show in ps or
// in a process's environment.
//
// Every role builds its franz-go options with Kafka.Opts and appends them to
// each kgo.NewClient it makes; etcd clients take TLS.Config. Probe checks the
// settings once at start-up, so a wrong password is a clear error instead of
// a role that retries forever. ACLs says which Kafka ACLs each role needs.
package clustersec

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// TLS says how a client speaks TLS. The zero value is plaintext.
type TLS struct {
	// Enabled turns TLS on with the system roots even if no file is given.
	Enabled bool
	// CAFile is a PEM bundle of the CAs to trust instead of the system roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and its key (PEM),
	// for brokers or etcd members that ask for one. Both or neither.
	CertFile, KeyFile string
	// ServerName is the name the server's certificate must carry (default:
	// the host dialed).
	ServerName string
}

// On reports whether TLS is asked for, by Enabled or by any file.
func (t TLS) On() bool {
	return t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// Config builds the client's tls.Config; nil (and no error) when TLS is off.
func (t TLS) Config() (*tls.Config, error) {
	if !t.On() {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls: read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: CA file %s holds no PEM certificate", t.CAFile)
		}
		c.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("tls: a client certificate needs both the cert file and the key file")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: load client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// SASL mechanisms, as given on the command line (case does not matter).
const (
	MechPlain       = "plain"
	MechScram256    = "scram-sha-256"
	MechScram512    = "scram-sha-512"
	MechOAuthBearer = "oauthbearer"
)

// Kafka is how a role's Kafka clients connect. The zero value is
// plaintext without SASL, as the dev broker wants.
type Kafka struct {
	TLS TLS
	// SASLMechanism is one of the Mech constants, or empty for no SASL.
	SASLMechanism string
	// SASLUser is the user of PLAIN and SCRAM.
	SASLUser string
	// SASLPasswordFile holds the password of PLAIN and SCRAM (one trailing
	// newline is dropped).
	SASLPasswordFile string
	// SASLTokenFile holds the OAUTHBEARER token. It is read again at every
	// authentication, so a sidecar may rotate it in place.
	SASLTokenFile string
}

// On reports whether anything but plaintext without SASL is configured.
func (k Kafka) On() bool { return k.TLS.On() || k.SASLMechanism != "" }

// String describes the settings without secrets, for logs and errors, e.g.
// "SASL SCRAM-SHA-256 as worker over TLS".
func (k Kafka) String() string {
	var parts []string
	switch m := strings.ToLower(k.SASLMechanism); m {
	case "":
		parts = append(parts, "no SASL")
	case MechOAuthBearer:
		parts = append(parts, "SASL OAUTHBEARER")
	default:
		parts = append(parts, fmt.Sprintf("SASL %s as %q", strings.ToUpper(m), k.SASLUser))
	}
	if k.TLS.On() {
		parts = append(parts, "over TLS")
	} else {
		parts = append(parts, "over plaintext")
	}
	return strings.Join(parts, " ")
}

// Opts returns the franz-go options to append to every kgo.NewClient of a
// role: DialTLSConfig and SASL as configured. It reads the password file
// now (the token file at each authentication) and fails on a missing file
// or an unknown mechanism.
func (k Kafka) Opts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	tc, err := k.TLS.Config()
	if err != nil {
		return nil, fmt.Errorf("kafka %w", err)
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	mech, err := k.mechanism()
	if err != nil {
		return nil, err
	}
	if mech != nil {
		opts = append(opts, kgo.SASL(mech))
	}
	return opts, nil
}

func (k Kafka) mechanism() (sasl.Mechanism, error) {
	m := strings.ToLower(k.SASLMechanism)
	if m == "" {
		if k.SASLUser != "" || k.SASLPasswordFile != "" || k.SASLTokenFile != "" {
			return nil, errors.New("kafka sasl: a user, password file or token file is set but no mechanism (plain, scram-sha-256, scram-sha-512, oauthbearer)")
		}
		return nil, nil
	}
	if m == MechOAuthBearer {
		if k.SASLTokenFile == "" {
			return nil, errors.New("kafka sasl: oauthbearer needs a token file")
		}
		if _, err := readSecret(k.SASLTokenFile, "token"); err != nil {
			return nil, err
		}
		file := k.SASLTokenFile
		return oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			tok, err := readSecret(file, "token")
			if err != nil {
				return oauth.Auth{}, err
			}
			return oauth.Auth{Token: tok}, nil
		}), nil
	}
	if k.SASLUser == "" || k.SASLPasswordFile == "" {
		return nil, fmt.Errorf("kafka sasl: %s needs a user and a password file", m)
	}
	pass, err := readSecret(k.SASLPasswordFile, "password")
	if err != nil {
		return nil, err
	}
	switch m {
	case MechPlain:
		return plain.Auth{User: k.SASLUser, Pass: pass}.AsMechanism(), nil
	case MechScram256:
		return scram.Auth{User: k.SASLUser, Pass: pass}.AsSha256Mechanism(), nil
	case MechScram512:
		return scram.Auth{User: k.SASLUser, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("kafka sasl: unknown mechanism %q (plain, scram-sha-256, scram-sha-512, oauthbearer)", k.SASLMechanism)
}

// readSecret reads a one-line secret file, dropping one trailing newline.
func readSecret(path, what string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("kafka sasl: read %s file: %w", what, err)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("kafka sasl: %s file %s is empty", what, path)
	}
	return s, nil
}

// ProbeTimeout bounds Probe.
const ProbeTimeout = 20 * time.Second

// Probe connects to the brokers with opts (Kafka.Opts) and asks for
// metadata, up to three times. It returns an error naming the problem when
// the brokers refuse the credentials, fail the TLS handshake, or close
// every connection during it (a broker that cannot tell a client why, as
// some do on a failed SASL exchange); a broker that cannot be reached at
// all is not an error here (the roles wait for Kafka as they always have),
// so Probe returns nil then. desc is Kafka.String. Call it only when
// Kafka.On: without TLS or SASL a closed connection says nothing.
func Probe(ctx context.Context, brokers []string, opts []kgo.Opt, desc string) error {
	pctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			select {
			case <-pctx.Done():
				return nil
			case <-time.After(300 * time.Millisecond):
			}
		}
		if err = ping(pctx, brokers, opts); err == nil {
			return nil
		}
		if !IsAuthError(err) && !closedByPeer(err) {
			return nil
		}
	}
	if closedByPeer(err) {
		return fmt.Errorf("kafka at %s closed every connection while authenticating (%s): wrong SASL user, password or mechanism, or a TLS mismatch? (%w)",
			strings.Join(brokers, ","), desc, err)
	}
	return fmt.Errorf("kafka at %s refused this client (%s): %w", strings.Join(brokers, ","), desc, err)
}

// ping makes one client and sends one metadata request with it.
func ping(ctx context.Context, brokers []string, opts []kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	return cl.Ping(ctx)
}

// closedByPeer reports whether err is a connection the broker accepted and
// then closed.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// IsAuthError reports whether err is Kafka refusing a client's credentials
// or a failed TLS handshake, as opposed to a broker being down.
func IsAuthError(err error) bool {
	for _, ke := range []*kerr.Error{kerr.SaslAuthenticationFailed, kerr.IllegalSaslState, kerr.UnsupportedSaslMechanism,
		kerr.ClusterAuthorizationFailed, kerr.TopicAuthorizationFailed} {
		if errors.Is(err, ke) {
			return true
		}
	}
	var (
		certErr   *tls.CertificateVerificationError
		unknownCA x509.UnknownAuthorityError
		hostErr   x509.HostnameError
		recErr    tls.RecordHeaderError
		alert     tls.AlertError
	)
	if errors.As(err, &certErr) || errors.As(err, &unknownCA) || errors.As(err, &hostErr) || errors.As(err, &recErr) || errors.As(err, &alert) {
		return true
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "remote error" {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "tls:") || strings.Contains(s, "x509:") || strings.Contains(s, "SASL")
}

// ProbeTLS makes one TLS connection to addr (host:port) with c and reads
// briefly, so that a server that refuses the client's certificate (TLS 1.3
// says so only after the handshake) is seen. It returns an error for a
// refused or failed handshake; an address that cannot be dialed, or a
// server that just waits for the client to speak, is no error.
func ProbeTLS(ctx context.Context, addr string, c *tls.Config) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("tls probe: %w", err)
	}
	c = c.Clone()
	if c.ServerName == "" {
		c.ServerName = host
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil
	}
	defer raw.Close()
	conn := tls.Client(raw, c)
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if err := conn.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("tls handshake with %s: %w", addr, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		return nil
	}
	if IsAuthError(err) {
		return fmt.Errorf("tls with %s: %w", addr, err)
	}
	return nil
}
