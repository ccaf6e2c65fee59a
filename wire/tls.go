package wire

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"time"
)

// The identities of the two ends of an authenticated link: a URI SAN of
// the end's certificate, issued by the link's own CA. A worker accepts only
// a client certificate naming GatewayID; a gateway accepts only a worker
// certificate naming WorkerID. Host names are not checked: workers
// advertise whatever address they listen on (port 0, container IPs), and
// the CA is the link's alone, so its signature and the role are the
// identity (docs/operations.md, "The gateway↔worker link").
const (
	GatewayID = "urn:chatpipe:link:gateway"
	WorkerID  = "urn:chatpipe:link:worker"
)

// TLS is one end's credentials for an authenticated link: the link CA and
// this end's certificate. Serve speaks TLS 1.3 as the worker with it and
// requires a gateway's client certificate; Dial speaks TLS 1.3 as the
// gateway and requires a worker's certificate. Both check the peer's chain
// against CAs and its role (GatewayID, WorkerID).
type TLS struct {
	CAs  *x509.CertPool
	Cert tls.Certificate
}

// LoadTLS reads a link CA bundle (PEM, one or more certificates: several
// during a rotation) and a certificate with its key.
func LoadTLS(caFile, certFile, keyFile string) (*TLS, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("link tls: read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("link tls: CA file %s holds no PEM certificate", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("link tls: load certificate: %w", err)
	}
	return &TLS{CAs: pool, Cert: cert}, nil
}

// Role returns GatewayID or WorkerID if the certificate names one (the
// first it names), else "".
func (t *TLS) Role() string {
	if leaf := t.leaf(); leaf != nil {
		return roleOf(leaf)
	}
	return ""
}

// NotAfter is when the certificate expires (zero if it cannot be parsed).
func (t *TLS) NotAfter() time.Time {
	if leaf := t.leaf(); leaf != nil {
		return leaf.NotAfter
	}
	return time.Time{}
}

func (t *TLS) leaf() *x509.Certificate {
	if t.Cert.Leaf != nil {
		return t.Cert.Leaf
	}
	if len(t.Cert.Certificate) == 0 {
		return nil
	}
	leaf, err := x509.ParseCertificate(t.Cert.Certificate[0])
	if err != nil {
		return nil
	}
	return leaf
}

func roleOf(c *x509.Certificate) string {
	for _, u := range c.URIs {
		if s := u.String(); s == GatewayID || s == WorkerID {
			return s
		}
	}
	return ""
}

func hasID(c *x509.Certificate, id string) bool {
	return slices.ContainsFunc(c.URIs, func(u *url.URL) bool { return u.String() == id })
}

// serverConfig is the worker's side: TLS 1.3 only, a client certificate
// from CAs required and verified, and it must name GatewayID.
func (t *TLS) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.Cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    t.CAs,
		VerifyConnection: func(cs tls.ConnectionState) error {
			// The chain (and the client-auth key usage) is verified by
			// RequireAndVerifyClientCert before this runs.
			if len(cs.PeerCertificates) == 0 || !hasID(cs.PeerCertificates[0], GatewayID) {
				return fmt.Errorf("link tls: the client certificate does not name %s", GatewayID)
			}
			return nil
		},
	}
}

// clientConfig is the gateway's side: TLS 1.3 only, its certificate
// offered, and the worker's verified against CAs (server-auth key usage)
// and required to name WorkerID instead of a host name.
func (t *TLS) clientConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Always offered, even if the worker asks for another CA's: the
		// worker then logs why it refused the link.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &t.Cert, nil },
		// Verification is not skipped: VerifyConnection verifies the chain
		// against the link CA, as the default would, but checks the role
		// instead of the host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyWorker(t.CAs, cs.PeerCertificates)
		},
	}
}

func verifyWorker(cas *x509.CertPool, chain []*x509.Certificate) error {
	if len(chain) == 0 {
		return errors.New("link tls: the worker sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: cas, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("link tls: the worker's certificate: %w", err)
	}
	if !hasID(chain[0], WorkerID) {
		return fmt.Errorf("link tls: the worker's certificate does not name %s", WorkerID)
	}
	return nil
}

// handshakeServer runs the worker's side of the TLS handshake on c within
// timeout.
func handshakeServer(ctx context.Context, c net.Conn, t *TLS, timeout time.Duration) (net.Conn, error) {
	tc := tls.Server(c, t.serverConfig())
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return tc, nil
}

// handshakeClient runs the gateway's side of the TLS handshake on c and
// then one ping round trip: in TLS 1.3 a server refuses a client
// certificate only after the client's handshake is done, so without the
// round trip a refused gateway would learn it from its first command's
// failure (an unknown outcome) instead of from Dial.
func handshakeClient(ctx context.Context, c net.Conn, t *TLS, timeout time.Duration) (net.Conn, error) {
	tc := tls.Client(c, t.clientConfig())
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.SetDeadline(deadline); err != nil {
		return nil, err
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	if _, err := tc.Write(pingLine()); err != nil {
		return nil, err
	}
	// Nothing but the answer to this ping can come before it, so reading
	// it byte by byte up to its newline takes nothing of what follows.
	var line []byte
	b := make([]byte, 1)
	for len(line) == 0 || line[len(line)-1] != '\n' {
		if len(line) > 4096 {
			return nil, fmt.Errorf("the worker's first answer is not a pong: %q…", line[:64])
		}
		if _, err := tc.Read(b); err != nil {
			return nil, fmt.Errorf("the worker refused the link: %w", err)
		}
		line = append(line, b[0])
	}
	var r Response
	if err := decode(line, &r); err != nil || r.RID != 0 {
		return nil, fmt.Errorf("the worker's first answer is not a pong: %q", line)
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return tc, nil
}
