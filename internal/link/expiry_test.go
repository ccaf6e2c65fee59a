package link_test

import (
	"crypto/x509"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/link"
)

// gaugeValue gathers c and returns its one sample's value and labels.
func gaugeValue(t *testing.T, c prometheus.Collector) (float64, map[string]string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "chatpipe_link_cert_expiry_seconds" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one chatpipe_link_cert_expiry_seconds sample", mfs)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	return m.GetGauge().GetValue(), labels
}

// TestLinkCertExpiryGauge: chatpipe_link_cert_expiry_seconds{role} is the
// time left on the certificate in use, and follows a rotation of its files
// without a handshake: a new certificate with its key moves it, and a
// certificate that does not match its key (half-way through replacing
// the two) leaves the previous one's expiry.
func TestLinkCertExpiryGauge(t *testing.T) {
	ca, err := clustersec.NewLinkCA("expiry", 1000*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(validity time.Duration, files ...string) {
		t.Helper()
		certPEM, keyPEM, err := ca.Issue("gw", link.GatewayID, x509.ExtKeyUsageClientAuth, validity)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // a new modification time, whatever the file system's granularity
		for _, f := range files {
			b := map[string][]byte{"ca.pem": ca.PEM, "cert.pem": certPEM, "key.pem": keyPEM}[f]
			writeFile(t, filepath.Join(dir, f), b)
		}
	}
	near := func(step string, got float64, want time.Duration) {
		t.Helper()
		if math.Abs(got-want.Seconds()) > 120 {
			t.Fatalf("%s: the gauge says %.0f s, want about %.0f s", step, got, want.Seconds())
		}
	}
	write(time.Hour, "ca.pem", "cert.pem", "key.pem")
	creds := load(t, dir)
	g := creds.ExpiryGauge()
	v, labels := gaugeValue(t, g)
	near("loaded", v, time.Hour)
	if labels["role"] != "gateway" {
		t.Fatalf("labels %v, want role=gateway", labels)
	}

	write(48*time.Hour, "cert.pem", "key.pem")
	v, _ = gaugeValue(t, g)
	near("rotated", v, 48*time.Hour)
	if got := time.Until(creds.NotAfterInUse()); got < 47*time.Hour {
		t.Fatalf("NotAfterInUse in %v after the rotation", got)
	}

	write(500*time.Hour, "cert.pem") // its key not yet
	v, _ = gaugeValue(t, g)
	near("certificate without its key", v, 48*time.Hour)

	write(500*time.Hour, "cert.pem", "key.pem")
	v, _ = gaugeValue(t, g)
	near("certificate with its key", v, 500*time.Hour)

	// A worker's credentials say so; credentials given as values (no
	// files) report their certificate.
	p := newPKI(t)
	v, labels = gaugeValue(t, (&link.TLS{CAs: p.worker.CAs, Cert: p.worker.Cert}).ExpiryGauge())
	near("worker", v, time.Hour)
	if labels["role"] != "worker" {
		t.Fatalf("labels %v, want role=worker", labels)
	}
}
