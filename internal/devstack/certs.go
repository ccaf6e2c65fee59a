package devstack

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Certs are the files of a throwaway PKI written by WriteCerts: a CA, a
// server certificate for 127.0.0.1 and localhost, and a client certificate,
// all PEM. They are for tests and local secured stacks only.
type Certs struct {
	CAFile                string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// WriteCerts makes a new CA and a server and a client certificate signed by
// it, valid for a day, and writes them into dir (keys mode 0600).
func WriteCerts(dir string) (Certs, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Certs{}, fmt.Errorf("devstack: certs dir: %w", err)
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Certs{}, fmt.Errorf("devstack: CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "chatpipe devstack CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Certs{}, fmt.Errorf("devstack: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Certs{}, fmt.Errorf("devstack: CA certificate: %w", err)
	}
	c := Certs{
		CAFile:     filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"),
	}
	if err := writePEM(c.CAFile, "CERTIFICATE", caDER, 0o644); err != nil {
		return Certs{}, err
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, certFile, keyFile string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("devstack: %s key: %w", cn, err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("devstack: %s certificate: %w", cn, err)
		}
		kder, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return fmt.Errorf("devstack: %s key: %w", cn, err)
		}
		if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
			return err
		}
		return writePEM(keyFile, "PRIVATE KEY", kder, 0o600)
	}
	if err := leaf(2, "localhost", x509.ExtKeyUsageServerAuth, c.ServerCert, c.ServerKey); err != nil {
		return Certs{}, err
	}
	if err := leaf(3, "chatpipe client", x509.ExtKeyUsageClientAuth, c.ClientCert, c.ClientKey); err != nil {
		return Certs{}, err
	}
	return c, nil
}

// ServerTLS is the listener side of the server certificate, e.g. for
// kfake.TLS.
func (c Certs) ServerTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.ServerCert, c.ServerKey)
	if err != nil {
		return nil, fmt.Errorf("devstack: server certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("devstack: write %s: %w", path, err)
	}
	return nil
}
