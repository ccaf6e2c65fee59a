package clustersec

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/chatpipe/chatpipe/internal/atomicfile"
	"github.com/chatpipe/chatpipe/internal/link"
)

// LinkCA is a certificate authority for the gateway↔worker link only. It
// signs the two role certificates (link.GatewayID, link.WorkerID); its key
// lives in memory and is not written anywhere by WriteLinkCerts.
type LinkCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate.
	PEM []byte
}

// NewLinkCA makes a link CA valid from an hour ago for validity.
func NewLinkCA(name string, validity time.Duration) (*LinkCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("link CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("link CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("link CA certificate: %w", err)
	}
	return &LinkCA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Issue signs a certificate for id (a URI SAN, e.g. link.GatewayID) with
// common name cn and the extended key usage usage, valid for validity (at
// most as long as the CA), and returns it and its key, PEM.
func (ca *LinkCA) Issue(cn, id string, usage x509.ExtKeyUsage, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	u, err := url.Parse(id)
	if err != nil {
		return nil, nil, fmt.Errorf("link certificate id %q: %w", id, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("%s key: %w", cn, err)
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		URIs:         []*url.URL{u},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("%s certificate: %w", cn, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("%s key: %w", cn, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// LinkFiles are the files of one end of the link, as WriteLinkCerts lays
// them out: DIR/gateway/ and DIR/worker/ each hold ca.pem, cert.pem and
// key.pem, so that each role can be given its own directory and nothing
// of the other's.
type LinkFiles struct {
	CA, Cert, Key string
}

// LinkDir returns the files of role ("gateway" or "worker") under dir.
func LinkDir(dir, role string) LinkFiles {
	d := filepath.Join(dir, role)
	return LinkFiles{CA: filepath.Join(d, "ca.pem"), Cert: filepath.Join(d, "cert.pem"), Key: filepath.Join(d, "key.pem")}
}

// WriteLinkCerts makes a new link CA and a gateway and a worker certificate
// signed by it, valid for validity, into dir (LinkDir), each file replaced
// crash-safely, keys mode 0600. If dir already holds every file it is left
// as it is and created is false (an init run again keeps the deployment's
// certificates); if it holds some of them, that is an error. The CA's key
// is not kept: a new certificate means a new CA (docs/operations.md says
// how to rotate).
func WriteLinkCerts(dir string, validity time.Duration) (created bool, err error) {
	if validity <= 0 {
		return false, errors.New("link certificates: the validity must be above 0")
	}
	var have, missing []string
	for _, role := range []string{RoleGateway, RoleWorker} {
		f := LinkDir(dir, role)
		for _, p := range []string{f.CA, f.Cert, f.Key} {
			if _, err := os.Stat(p); err == nil {
				have = append(have, p)
			} else if errors.Is(err, fs.ErrNotExist) {
				missing = append(missing, p)
			} else {
				return false, fmt.Errorf("link certificates: %w", err)
			}
		}
	}
	if len(missing) == 0 {
		return false, nil
	}
	if len(have) > 0 {
		return false, fmt.Errorf("link certificates: %s holds %v but not %v; remove the directory or complete it", dir, have, missing)
	}
	ca, err := NewLinkCA("chatpipe link CA", validity)
	if err != nil {
		return false, err
	}
	for _, r := range []struct {
		role, cn, id string
		usage        x509.ExtKeyUsage
	}{
		{RoleGateway, "chatpipe gateway", link.GatewayID, x509.ExtKeyUsageClientAuth},
		{RoleWorker, "chatpipe worker", link.WorkerID, x509.ExtKeyUsageServerAuth},
	} {
		cert, key, err := ca.Issue(r.cn, r.id, r.usage, validity)
		if err != nil {
			return false, err
		}
		f := LinkDir(dir, r.role)
		if err := os.MkdirAll(filepath.Dir(f.CA), 0o700); err != nil {
			return false, fmt.Errorf("link certificates: %w", err)
		}
		// The key first and the CA last: a crash leaves a partial set,
		// which the next run refuses instead of using.
		if err := atomicfile.Write(f.Key, key, 0o600); err != nil {
			return false, err
		}
		if err := atomicfile.Write(f.Cert, cert, 0o644); err != nil {
			return false, err
		}
		if err := atomicfile.Write(f.CA, ca.PEM, 0o644); err != nil {
			return false, err
		}
	}
	return true, nil
}
