package link_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/protocol"
)

// pki is a link CA with certificates of every kind the tests need.
type pki struct {
	ca                   *clustersec.LinkCA
	gateway, worker      *link.TLS
	other                *link.TLS // same CA, client auth, names neither role
	workerAsClient       *link.TLS // the worker's certificate offered by a client
	gatewayAsServer      *link.TLS // a gateway's certificate served by a worker
	foreignGateway       *link.TLS // a gateway certificate from another CA
	foreignWorker        *link.TLS // a worker certificate from another CA
	plainTLSClientConfig *tls.Config
}

func issue(t *testing.T, ca *clustersec.LinkCA, trust []byte, id string, usage x509.ExtKeyUsage) *link.TLS {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue("test "+id, id, usage, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string][]byte{"ca.pem": trust, "cert.pem": certPEM, "key.pem": keyPEM}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := link.LoadTLS(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, err := clustersec.NewLinkCA("test link CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := clustersec.NewLinkCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{ca: ca}
	p.gateway = issue(t, ca, ca.PEM, link.GatewayID, x509.ExtKeyUsageClientAuth)
	p.worker = issue(t, ca, ca.PEM, link.WorkerID, x509.ExtKeyUsageServerAuth)
	p.other = issue(t, ca, ca.PEM, "urn:chatpipe:link:persist", x509.ExtKeyUsageClientAuth)
	p.workerAsClient = issue(t, ca, ca.PEM, link.WorkerID, x509.ExtKeyUsageServerAuth)
	p.gatewayAsServer = issue(t, ca, ca.PEM, link.GatewayID, x509.ExtKeyUsageClientAuth)
	// The other CA's certificates trust the other CA: each side of a
	// foreign deployment is consistent, just not this one's.
	p.foreignGateway = issue(t, other, other.PEM, link.GatewayID, x509.ExtKeyUsageClientAuth)
	p.foreignWorker = issue(t, other, other.PEM, link.WorkerID, x509.ExtKeyUsageServerAuth)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	p.plainTLSClientConfig = &tls.Config{RootCAs: pool, ServerName: "ignored", InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	return p
}

// logBuf is a log a test reads while a server writes it.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serveTLS runs a worker's link server with creds; handled counts the
// commands that reached its handler.
func serveTLS(t *testing.T, creds *link.TLS) (addr string, handled *atomic.Int64) {
	addr, handled, _ = serveTLSLog(t, creds)
	return addr, handled
}

// serveTLSLog is serveTLS that also returns the server's log.
func serveTLSLog(t *testing.T, creds *link.TLS) (addr string, handled *atomic.Int64, logs *logBuf) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	handled = &atomic.Int64{}
	h := func(req *link.Request, reply func(*link.Response)) {
		handled.Add(1)
		reply(&link.Response{RID: req.RID, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: req.Req.ID}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	logs = &logBuf{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	go func() { defer close(done); link.Serve(ctx, ln, h, link.Config{TLS: creds}, log) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String(), handled, logs
}

const sendLine = `{"rid":1,"user":"mallory","req":{"op":"send","id":"r1","conversation_id":"c","client_message_id":"m","body":"forged"}}` + "\n"

// A gateway's certificate from the link CA makes a working link, and the
// link carries commands both ways.
func TestLinkTLSGatewayCertificateWorks(t *testing.T) {
	p := newPKI(t)
	addr, handled := serveTLS(t, p.worker)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := link.Dial(ctx, addr, link.Config{TLS: p.gateway})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := 0; i < 3; i++ {
		r, err := cl.Do(ctx, "alice", &protocol.Request{Op: "send", ID: "r"})
		if err != nil || r.Reply == nil || r.Reply.Op != protocol.OpAccepted {
			t.Fatalf("call %d over mutual TLS: %+v %v", i, r, err)
		}
	}
	if n := handled.Load(); n != 3 {
		t.Fatalf("handled %d commands, want 3", n)
	}
}

// Every client that does not authenticate as a gateway of this link's CA
// is refused, and none of what it sends reaches the handler: plaintext
// (the old wire format), TLS without a certificate, a gateway certificate
// from another CA, a certificate of the link CA naming another role, and
// the worker's own certificate offered as a client's.
func TestLinkTLSRefusesClientsThatAreNotGateways(t *testing.T) {
	p := newPKI(t)
	addr, handled, logs := serveTLSLog(t, p.worker)

	t.Run("plaintext", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte(sendLine))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil && !isReset(err) {
			t.Fatalf("plaintext link not closed: %v", err)
		}
		if strings.Contains(string(b), "rid") {
			t.Fatalf("plaintext client got an answer: %q", b)
		}
	})
	t.Run("no certificate", func(t *testing.T) {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		c := tls.Client(raw, p.plainTLSClientConfig)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		// TLS 1.3: the client's side of the handshake completes; the
		// server's refusal comes with the first read.
		err = c.Handshake()
		if err == nil {
			c.Write([]byte(sendLine))
			_, err = c.Read(make([]byte, 1))
		}
		if err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Fatalf("TLS client without a certificate: %v, want the worker to require one", err)
		}
	})
	// The worker's reason for each refusal, as it logs it.
	reasons := map[string]string{
		"another CA":            "certificate signed by unknown authority",
		"another role":          "the client certificate does not name " + link.GatewayID,
		"worker cert as client": "incompatible key usage",
	}
	for name, creds := range map[string]*link.TLS{
		"another CA":            p.foreignGateway,
		"another role":          p.other,
		"worker cert as client": p.workerAsClient,
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The foreign gateway trusts its own CA, not this worker's:
			// let it trust this one to see the worker refuse it (its
			// certificate is offered, the worker does not know its CA).
			if creds == p.foreignGateway {
				pool := x509.NewCertPool()
				pool.AppendCertsFromPEM(p.ca.PEM)
				creds = &link.TLS{CAs: pool, Cert: creds.Cert}
			}
			cl, err := link.Dial(ctx, addr, link.Config{TLS: creds})
			if err == nil {
				cl.Close()
				t.Fatal("dialed a link the worker must refuse")
			}
			if !strings.Contains(err.Error(), "the worker refused the link") {
				t.Fatalf("dial: %v, want the worker's refusal", err)
			}
			t.Logf("refused: %v", err)
			waitLog(t, logs, reasons[name])
		})
	}
	if n := handled.Load(); n != 0 {
		t.Fatalf("%d commands of unauthenticated clients reached the handler", n)
	}

	// The worker still serves a gateway.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := link.Dial(ctx, addr, link.Config{TLS: p.gateway})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if r, err := cl.Do(ctx, "alice", &protocol.Request{Op: "send", ID: "r"}); err != nil || r.Reply == nil {
		t.Fatalf("gateway after the refusals: %+v %v", r, err)
	}
}

// A gateway talks only to a worker of its link CA: a server with a
// certificate of another CA, one naming the gateway role, or no TLS at all
// fails Dial, before any command is sent.
func TestLinkTLSGatewayRefusesServersThatAreNotWorkers(t *testing.T) {
	p := newPKI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, c := range map[string]struct {
		creds *link.TLS
		want  string
	}{
		"another CA":   {p.foreignWorker, "certificate signed by unknown authority"},
		"gateway cert": {p.gatewayAsServer, "incompatible key usage"},
	} {
		t.Run(name, func(t *testing.T) {
			// The server trusts this link's gateways: only the gateway's
			// check of the server can fail.
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(p.ca.PEM)
			addr, handled := serveTLS(t, &link.TLS{CAs: pool, Cert: c.creds.Cert})
			cl, err := link.Dial(ctx, addr, link.Config{TLS: p.gateway})
			if err == nil {
				cl.Close()
				t.Fatal("the gateway dialed a server that is not a worker of its CA")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("dial: %v, want %q", err, c.want)
			}
			if handled.Load() != 0 {
				t.Fatal("a command reached the server")
			}
		})
	}
	t.Run("plaintext worker", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		sctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		var handled atomic.Int64
		go func() {
			defer close(done)
			link.Serve(sctx, ln, func(req *link.Request, reply func(*link.Response)) { handled.Add(1) }, link.Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		}()
		defer func() { stop(); <-done }()
		cl, err := link.Dial(ctx, ln.Addr().String(), link.Config{TLS: p.gateway})
		if err == nil {
			cl.Close()
			t.Fatal("the gateway dialed a plaintext worker")
		}
		if handled.Load() != 0 {
			t.Fatal("a command reached the plaintext worker")
		}
	})
}

// Role and NotAfter read a certificate's link role and expiry.
func TestLinkTLSRoleOfCertificates(t *testing.T) {
	p := newPKI(t)
	if p.gateway.Role() != link.GatewayID || p.worker.Role() != link.WorkerID || p.other.Role() != "" {
		t.Fatalf("roles: %q %q %q", p.gateway.Role(), p.worker.Role(), p.other.Role())
	}
	if time.Until(p.gateway.NotAfter()) > time.Hour || time.Until(p.gateway.NotAfter()) < 50*time.Minute {
		t.Fatalf("NotAfter %v", p.gateway.NotAfter())
	}
}

// waitLog waits for the server's log to say want.
func waitLog(t *testing.T, logs *logBuf, want string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), want); {
		if time.Now().After(deadline) {
			t.Fatalf("the worker's log does not say %q:\n%s", want, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && strings.Contains(err.Error(), "reset")
}

// linkFiles writes a CA bundle and a certificate of ca for id into dir.
func linkFiles(t *testing.T, dir string, bundle []byte, ca *clustersec.LinkCA, id string, usage x509.ExtKeyUsage) {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue("test "+id, id, usage, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"ca.pem": bundle, "cert.pem": certPEM, "key.pem": keyPEM} {
		writeFile(t, filepath.Join(dir, name), b)
	}
}

// writeFile replaces path as an operator's tool would: a new file renamed
// over the old one.
func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func load(t *testing.T, dir string) *link.TLS {
	t.Helper()
	c, err := link.LoadTLS(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Rotating the link CA in place, as docs/operations.md says (both CAs
// trusted, then the new certificates, then the new CA alone), keeps new
// links working at every step without a restart; at the end a gateway
// certificate of the old CA is refused. A certificate file that does not
// match its key leaves the previous credentials in use.
func TestLinkTLSRotationInPlace(t *testing.T) {
	ca1, err := clustersec.NewLinkCA("old", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := clustersec.NewLinkCA("new", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	wdir, gdir := t.TempDir(), t.TempDir()
	linkFiles(t, wdir, ca1.PEM, ca1, link.WorkerID, x509.ExtKeyUsageServerAuth)
	linkFiles(t, gdir, ca1.PEM, ca1, link.GatewayID, x509.ExtKeyUsageClientAuth)
	// A gateway that keeps the old CA's certificate (and trusts both CAs,
	// so that only the worker's check can fail).
	oldGateway := &link.TLS{CAs: x509.NewCertPool(), Cert: load(t, gdir).Cert}
	oldGateway.CAs.AppendCertsFromPEM(ca1.PEM)
	oldGateway.CAs.AppendCertsFromPEM(ca2.PEM)
	addr, _ := serveTLS(t, load(t, wdir))
	gateway := load(t, gdir)
	dial := func(step string, creds *link.TLS) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cl, err := link.Dial(ctx, addr, link.Config{TLS: creds})
		if err != nil {
			return err
		}
		defer cl.Close()
		if r, err := cl.Do(ctx, "alice", &protocol.Request{Op: "send", ID: "r"}); err != nil || r.Reply == nil {
			t.Fatalf("%s: call: %+v %v", step, r, err)
		}
		return nil
	}
	must := func(step string) {
		t.Helper()
		if err := dial(step, gateway); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	must("old CA")
	both := append(append([]byte{}, ca1.PEM...), ca2.PEM...)
	writeFile(t, filepath.Join(wdir, "ca.pem"), both)
	writeFile(t, filepath.Join(gdir, "ca.pem"), both)
	must("both CAs trusted")
	linkFiles(t, wdir, both, ca2, link.WorkerID, x509.ExtKeyUsageServerAuth)
	must("new worker certificate")
	linkFiles(t, gdir, both, ca2, link.GatewayID, x509.ExtKeyUsageClientAuth)
	must("new gateway certificate")
	writeFile(t, filepath.Join(wdir, "ca.pem"), ca2.PEM)
	writeFile(t, filepath.Join(gdir, "ca.pem"), ca2.PEM)
	must("new CA alone")
	if err := dial("old gateway certificate", oldGateway); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a gateway certificate of the removed CA: %v, want it refused", err)
	}

	// A certificate that does not match its key is not loaded: the
	// gateway keeps using the one it has, and says why if a dial fails.
	other, _, err := ca2.Issue("stray", link.GatewayID, x509.ExtKeyUsageClientAuth, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(gdir, "cert.pem"), other)
	must("mismatched certificate file")
	// A worker certificate put where the gateway's was is not loaded
	// either (it would be refused by every worker).
	linkFiles(t, gdir, ca2.PEM, ca2, link.WorkerID, x509.ExtKeyUsageServerAuth)
	must("certificate of another role")
}

// With AllowPlaintext (turning TLS on in a running deployment, workers
// first) a worker serves plaintext gateways and TLS gateways alike, and
// still refuses a TLS client that is not a gateway.
func TestLinkTLSSwitchOverServesBoth(t *testing.T) {
	p := newPKI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	h := func(req *link.Request, reply func(*link.Response)) {
		handled.Add(1)
		reply(&link.Response{RID: req.RID, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: req.Req.ID}})
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		link.Serve(sctx, ln, h, link.Config{TLS: p.worker, AllowPlaintext: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	defer func() { stop(); <-done }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, creds := range map[string]*link.TLS{"plaintext gateway": nil, "TLS gateway": p.gateway} {
		cl, err := link.Dial(ctx, ln.Addr().String(), link.Config{TLS: creds})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		r, err := cl.Do(ctx, "alice", &protocol.Request{Op: "send", ID: "r"})
		cl.Close()
		if err != nil || r.Reply == nil {
			t.Fatalf("%s: %+v %v", name, r, err)
		}
	}
	if cl, err := link.Dial(ctx, ln.Addr().String(), link.Config{TLS: p.other}); err == nil {
		cl.Close()
		t.Fatal("a TLS client naming another role was served")
	}
	if n := handled.Load(); n != 2 {
		t.Fatalf("handled %d, want 2", n)
	}
}

// Over TLS too, a worker's reply never waits for a gateway that does not
// read: closing the link does not wait to say goodbye (close_notify) to a
// peer whose socket is full.
func TestLinkTLSReplyToPeerThatDoesNotReadDoesNotBlock(t *testing.T) {
	p := newPKI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	replies := make(chan func(*link.Response), 1)
	h := func(req *link.Request, reply func(*link.Response)) {
		select {
		case replies <- reply:
		default:
		}
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		link.Serve(sctx, ln, h, link.Config{TLS: p.worker, QueueLen: 64}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	defer func() { stop(); <-done }()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	gw := p.gateway.Cert
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &gw, nil }})
	if _, err := c.Write([]byte(sendLine)); err != nil {
		t.Fatal(err)
	}
	reply := <-replies
	big := strings.Repeat("x", 16<<10)
	// Fill the socket (the peer reads nothing), then keep replying: one
	// reply finds the queue full and closes the link, the others return.
	var slowest time.Duration
	for i := 0; i < 2000; i++ {
		start := time.Now()
		reply(&link.Response{RID: 1, Reply: &protocol.Reply{Op: protocol.OpRejected, ID: "r1", Message: big}})
		slowest = max(slowest, time.Since(start))
	}
	if slowest > time.Second {
		t.Fatalf("a reply took %v on a TLS peer that does not read", slowest)
	}
}

// What mutual TLS costs a call, against the plaintext link (the same
// parallel round trips as BenchmarkLinkRoundTrip's wire case):
//
//	go test ./internal/link -run '^$' -bench LinkTLSRoundTrip -benchmem
func BenchmarkLinkTLSRoundTrip(b *testing.B) {
	ca, err := clustersec.NewLinkCA("bench", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	mk := func(id string, usage x509.ExtKeyUsage) *link.TLS {
		certPEM, keyPEM, err := ca.Issue(id, id, usage, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			b.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca.PEM)
		return &link.TLS{CAs: pool, Cert: cert}
	}
	worker, gateway := mk(link.WorkerID, x509.ExtKeyUsageServerAuth), mk(link.GatewayID, x509.ExtKeyUsageClientAuth)
	req := &protocol.Request{Op: protocol.OpSend, ID: "r12345", ConversationID: "g-000123", ClientMessageID: "u-000042-000000001234",
		Body: "hello there, this is a message of a typical length for a chat app"}
	for _, c := range []struct {
		name           string
		server, client *link.TLS
	}{{"plaintext", nil, nil}, {"mtls", worker, gateway}} {
		b.Run(c.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				link.Serve(ctx, ln, func(r *link.Request, reply func(*link.Response)) {
					reply(&link.Response{RID: r.RID, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: r.Req.ID, ConversationID: r.Req.ConversationID,
						Seq: 4711, MessageID: "01KQ8Z3V9T4B6N2M5X7C1D0F8G", ClientMessageID: r.Req.ClientMessageID}})
				}, link.Config{TLS: c.server}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			}()
			defer func() { cancel(); <-done }()
			cl, err := link.Dial(context.Background(), ln.Addr().String(), link.Config{TLS: c.client})
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := cl.Do(context.Background(), "u-000042", req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// ticketCache is a client session cache that records what it is given.
type ticketCache struct {
	tls.ClientSessionCache
	mu   sync.Mutex
	puts int
}

func (c *ticketCache) Put(key string, cs *tls.ClientSessionState) {
	c.mu.Lock()
	c.puts++
	c.mu.Unlock()
	c.ClientSessionCache.Put(key, cs)
}

// A worker never resumes a TLS session, nor issues session tickets: every
// link's handshake verifies the gateway's certificate against the
// worker's CA file as it is then.
// A gateway that kept session tickets (this one is a plain TLS client
// with a session cache; chatpipe's gateway keeps none) still does a full
// handshake while its certificate is trusted, and once the worker's CA
// file no longer holds its CA it is refused, ticket or not.
func TestLinkTLSWorkerNeverResumesASession(t *testing.T) {
	ca1, err := clustersec.NewLinkCA("old", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := clustersec.NewLinkCA("new", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	wdir, gdir := t.TempDir(), t.TempDir()
	linkFiles(t, wdir, append(append([]byte{}, ca1.PEM...), ca2.PEM...), ca2, link.WorkerID, x509.ExtKeyUsageServerAuth)
	linkFiles(t, gdir, ca1.PEM, ca1, link.GatewayID, x509.ExtKeyUsageClientAuth)
	addr, handled := serveTLS(t, load(t, wdir))
	cache := &ticketCache{ClientSessionCache: tls.NewLRUClientSessionCache(8)}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{load(t, gdir).Cert},
		InsecureSkipVerify: true, ClientSessionCache: cache} // only the worker's check is under test
	// dial sends a command over a new TLS connection and reads the answer:
	// the worker answers only a gateway it accepted.
	dial := func(step string) (resumed bool, err error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return false, fmt.Errorf("%s: dial: %w", step, err)
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		resumed = c.(*tls.Conn).ConnectionState().DidResume
		if _, err := io.WriteString(c, sendLine); err != nil {
			return resumed, fmt.Errorf("%s: write: %w", step, err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return resumed, fmt.Errorf("%s: read the answer: %w", step, err)
		}
		if !strings.Contains(line, `"rid":1`) {
			t.Fatalf("%s: answer %q", step, line)
		}
		return resumed, nil
	}
	for _, step := range []string{"first link", "second link"} {
		resumed, err := dial(step)
		if err != nil {
			t.Fatal(err)
		}
		if resumed {
			t.Fatalf("%s: the worker resumed a TLS session (%d tickets kept): a link must verify the gateway's certificate at every handshake", step, cache.puts)
		}
	}
	if cache.puts != 0 {
		t.Errorf("the worker issued %d session tickets over two links; it never redeems one, so it issues none", cache.puts)
	}
	writeFile(t, filepath.Join(wdir, "ca.pem"), ca2.PEM)
	resumed, err := dial("old CA removed")
	if err == nil {
		t.Fatalf("a gateway certificate of the removed CA was answered (session resumed: %v, %d tickets kept)", resumed, cache.puts)
	}
	if resumed {
		t.Fatalf("old CA removed: the worker resumed a TLS session before refusing it: %v", err)
	}
	if n := handled.Load(); n != 2 {
		t.Fatalf("the handler ran %d commands, want 2 (none after the CA was removed)", n)
	}
}

// A gateway never resumes a TLS session either: it keeps no tickets, so
// every link's handshake verifies the worker's certificate against the
// gateway's CA file as it is then. The worker here is a plain TLS server
// that issues tickets it would accept (one config, fixed ticket keys, any
// client certificate): the gateway still does a full handshake each time,
// and once its CA file no longer holds the worker's CA, refuses it.
func TestLinkTLSGatewayNeverResumesASession(t *testing.T) {
	ca1, err := clustersec.NewLinkCA("old", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := clustersec.NewLinkCA("new", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	wdir, gdir := t.TempDir(), t.TempDir()
	linkFiles(t, wdir, ca1.PEM, ca1, link.WorkerID, x509.ExtKeyUsageServerAuth)
	linkFiles(t, gdir, ca1.PEM, ca1, link.GatewayID, x509.ExtKeyUsageClientAuth)
	scfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{load(t, wdir).Cert},
		ClientAuth: tls.RequireAnyClientCert}
	scfg.SetSessionTicketKeys([][32]byte{{1, 2, 3}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	type accepted struct {
		resumed bool
		err     error
	}
	links := make(chan accepted, 8)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				tc := tls.Server(c, scfg)
				if err := tc.Handshake(); err != nil {
					links <- accepted{err: err}
					return
				}
				links <- accepted{resumed: tc.ConnectionState().DidResume}
				// Answer the gateway's ping, then pings and commands alike
				// with a pong, until the gateway closes the link.
				r := bufio.NewReader(tc)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					if _, err := io.WriteString(tc, `{"rid":0,"pong":true}`+"\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	gateway := load(t, gdir)
	dial := func(step string) (accepted, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cl, err := link.Dial(ctx, ln.Addr().String(), link.Config{TLS: gateway})
		if err == nil {
			cl.Close()
		}
		select {
		case l := <-links:
			return l, err
		case <-ctx.Done():
			t.Fatalf("%s: the worker saw no handshake", step)
			return accepted{}, nil
		}
	}
	for _, step := range []string{"first link", "second link"} {
		l, err := dial(step)
		if err != nil || l.err != nil {
			t.Fatalf("%s: dial %v, worker's handshake %v", step, err, l.err)
		}
		if l.resumed {
			t.Fatalf("%s: the gateway resumed a TLS session: a link must verify the worker's certificate at every handshake", step)
		}
	}
	writeFile(t, filepath.Join(gdir, "ca.pem"), ca2.PEM)
	l, err := dial("old CA removed")
	if err == nil {
		t.Fatalf("the gateway accepted a worker certificate of the removed CA (session resumed: %v)", l.resumed)
	}
	if l.resumed {
		t.Fatalf("old CA removed: the gateway resumed a TLS session before refusing it: %v", err)
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("old CA removed: dial %v, want the worker's certificate refused", err)
	}
}
