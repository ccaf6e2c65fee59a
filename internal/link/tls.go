package link

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
//
// A TLS from LoadTLS reads its files again at the first handshake after
// one of them changed, so certificates and CAs are rotated in place without
// a restart (links already up keep the session they authenticated). Files
// that cannot be loaded, a certificate that does not match its key, or one
// of another role leave the loaded credentials in use until they can.
type TLS struct {
	CAs  *x509.CertPool
	Cert tls.Certificate

	files *tlsFiles // nil: CAs and Cert as given
}

// tlsFiles are the files of a TLS from LoadTLS and what was last loaded
// from them.
type tlsFiles struct {
	ca, cert, key string

	mu      sync.Mutex
	stamps  [3]fileStamp // of the files as last loaded (or tried)
	cas     *x509.CertPool
	crt     tls.Certificate
	role    string
	lastErr error // of the last reload that failed; nil once one succeeds
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func stamp(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}
}

// LoadTLS reads a link CA bundle (PEM, one or more certificates: several
// during a rotation) and a certificate with its key, and watches the files
// for changes (see TLS).
func LoadTLS(caFile, certFile, keyFile string) (*TLS, error) {
	f := &tlsFiles{ca: caFile, cert: certFile, key: keyFile}
	st := f.stampAll()
	cas, cert, err := f.load()
	if err != nil {
		return nil, err
	}
	f.stamps, f.cas, f.crt = st, cas, cert
	t := &TLS{CAs: cas, Cert: cert, files: f}
	f.role = t.Role()
	return t, nil
}

func (f *tlsFiles) stampAll() [3]fileStamp {
	return [3]fileStamp{stamp(f.ca), stamp(f.cert), stamp(f.key)}
}

func (f *tlsFiles) load() (*x509.CertPool, tls.Certificate, error) {
	pem, err := os.ReadFile(f.ca)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("link tls: read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, tls.Certificate{}, fmt.Errorf("link tls: CA file %s holds no PEM certificate", f.ca)
	}
	cert, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("link tls: load certificate: %w", err)
	}
	return pool, cert, nil
}

// current returns the credentials to use for a new handshake, reloading
// the files if they changed; reloadErr is why the last reload failed (the
// previous credentials are returned then).
func (t *TLS) current() (cas *x509.CertPool, cert *tls.Certificate, reloadErr error) {
	f := t.files
	if f == nil {
		return t.CAs, &t.Cert, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := f.stampAll(); st != f.stamps {
		f.stamps = st
		cas, crt, err := f.load()
		if err == nil {
			if role := (&TLS{Cert: crt}).Role(); role != f.role {
				err = fmt.Errorf("link tls: %s now names %q, not %s: not loaded", f.cert, role, f.role)
			}
		}
		if err != nil {
			f.lastErr = err
		} else {
			f.cas, f.crt, f.lastErr = cas, crt, nil
		}
	}
	crt := f.crt
	return f.cas, &crt, f.lastErr
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

// NotAfterInUse is when the certificate the next handshake presents
// expires. Like a handshake, it first reads the files again if one of them
// changed, so it follows a rotation; a set that cannot be loaded leaves the
// previous certificate in use, and so its expiry.
func (t *TLS) NotAfterInUse() time.Time {
	_, cert, _ := t.current()
	return (&TLS{Cert: *cert}).NotAfter()
}

// ExpiryGauge is the gauge chatpipe_link_cert_expiry_seconds{role}: the
// seconds until the link certificate in use (NotAfterInUse) expires,
// negative once it has; role is "gateway" or "worker", from the
// certificate.
func (t *TLS) ExpiryGauge() prometheus.Collector {
	role := ""
	switch t.Role() {
	case GatewayID:
		role = "gateway"
	case WorkerID:
		role = "worker"
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "chatpipe_link_cert_expiry_seconds",
		Help:        "Seconds until the gateway-worker link certificate in use expires (negative: expired); follows a rotation of its files.",
		ConstLabels: prometheus.Labels{"role": role},
	}, func() float64 { return time.Until(t.NotAfterInUse()).Seconds() })
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
// from cas required and verified, and it must name GatewayID. No session
// tickets: a link never resumes a session, so every handshake verifies
// the gateway's chain against the CA file as it is then (a config built
// per handshake could not redeem its tickets anyway; none are minted).
func serverConfig(cas *x509.CertPool, cert *tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		Certificates:           []tls.Certificate{*cert},
		ClientAuth:             tls.RequireAndVerifyClientCert,
		ClientCAs:              cas,
		SessionTicketsDisabled: true,
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
// offered, and the worker's verified against cas (server-auth key usage)
// and required to name WorkerID instead of a host name. It has no
// ClientSessionCache: the gateway keeps no session ticket and never
// resumes a session, so every handshake verifies the worker's chain
// against the CA file as it is then.
func clientConfig(cas *x509.CertPool, cert *tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Always offered, even if the worker asks for another CA's: the
		// worker then logs why it refused the link.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil },
		// Verification is not skipped: VerifyConnection verifies the chain
		// against the link CA, as the default would, but checks the role
		// instead of the host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyWorker(cas, cs.PeerCertificates)
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
// timeout; reloadErr is as of TLS.current.
func handshakeServer(ctx context.Context, c net.Conn, t *TLS, timeout time.Duration) (conn net.Conn, reloadErr, err error) {
	cas, cert, reloadErr := t.current()
	tc := tls.Server(c, serverConfig(cas, cert))
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, reloadErr, err
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, reloadErr, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, reloadErr, err
	}
	return tlsConn{Conn: tc, raw: c}, reloadErr, nil
}

// handshakeClient runs the gateway's side of the TLS handshake on c and
// then one ping round trip: in TLS 1.3 a server refuses a client
// certificate only after the client's handshake is done, so without the
// round trip a refused gateway would learn it from its first command's
// failure (an unknown outcome) instead of from Dial.
func handshakeClient(ctx context.Context, c net.Conn, t *TLS, timeout time.Duration) (net.Conn, error) {
	cas, cert, reloadErr := t.current()
	tc := tls.Client(c, clientConfig(cas, cert))
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
			if reloadErr != nil { // the likely cause
				return nil, fmt.Errorf("the worker refused the link: %w (and %w)", err, reloadErr)
			}
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
	return tlsConn{Conn: tc, raw: c}, nil
}

// sniffTLS reads the first byte of c (within timeout) and reports whether
// it starts a TLS handshake record; the returned conn reads it again.
func sniffTLS(c net.Conn, timeout time.Duration) (net.Conn, bool, error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, false, err
	}
	br := bufio.NewReader(c)
	b, err := br.Peek(1)
	if err != nil {
		return nil, false, err
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return nil, false, err
	}
	return peekedConn{Conn: c, r: br}, b[0] == 0x16, nil // 0x16: a handshake record
}

// peekedConn is a connection whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (p peekedConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// tlsConn is a TLS connection whose Close closes the TCP connection at
// once, without the close_notify alert a tls.Conn would first try to send
// for up to 5 s: a worker closes a link from reply, which must never
// block, and a peer that does not read would hold it there. A peer reading
// lines loses nothing by it: a line cut short is not decoded.
type tlsConn struct {
	*tls.Conn
	raw net.Conn
}

func (c tlsConn) Close() error { return c.raw.Close() }
