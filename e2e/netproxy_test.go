package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// toxiServer is the in-process toxiproxy server the network-fault proxies
// belong to (no HTTP API is started; toxics are set directly).
var (
	toxiOnce   sync.Once
	toxiServer *toxiproxy.ApiServer
)

// netProxy is a toxiproxy TCP proxy in this process, in front of one role
// or backing service. Toxics apply to the connections it carries now and
// to those opened later, until removed.
type netProxy struct {
	t *testing.T
	p *toxiproxy.Proxy
}

// startNetProxy listens on a free port of 127.0.0.1 and forwards each
// connection to upstream.
func startNetProxy(t *testing.T, name, upstream string) *netProxy {
	t.Helper()
	toxiOnce.Do(func() {
		toxiServer = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	})
	p := toxiproxy.NewProxy(toxiServer, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("start proxy %s: %v", name, err)
	}
	t.Cleanup(p.Stop)
	return &netProxy{t: t, p: p}
}

// addr is the proxy's listen address.
func (np *netProxy) addr() string { return np.p.Listen }

// toxic adds a toxic: typ is a toxiproxy toxic type (latency, timeout,
// reset_peer, limit_data, bandwidth, slicer, ...), stream "upstream"
// (client to server) or "downstream" (server to client).
func (np *netProxy) toxic(name, typ, stream string, attrs map[string]any) {
	np.t.Helper()
	b, _ := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if _, err := np.p.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
		np.t.Fatalf("proxy %s: add toxic %s: %v", np.p.Name, name, err)
	}
}

// latency delays each chunk of data by ms ± jitter milliseconds, both ways.
func (np *netProxy) latency(ms, jitter int) {
	for _, s := range []string{"upstream", "downstream"} {
		np.toxic("latency_"+s, "latency", s, map[string]any{"latency": ms, "jitter": jitter})
	}
}

// blackhole stops data in the given streams: it is read and dropped, and
// the connections stay open (a timeout toxic with no timeout). With one
// stream only the link is half-open.
func (np *netProxy) blackhole(streams ...string) {
	for _, s := range streams {
		np.toxic("blackhole_"+s, "timeout", s, map[string]any{"timeout": 0})
	}
}

// heal removes every toxic. Removing a timeout toxic closes the
// connections it held (their data was dropped, so they are unusable);
// connections opened afterwards pass untouched.
func (np *netProxy) heal() {
	np.p.Toxics.ResetToxics(context.Background())
}

// pgHostPort is the host:port of a postgres:// URL, for a proxy upstream.
func pgHostPort(t *testing.T, rawURL string) string {
	t.Helper()
	rest, ok := strings.CutPrefix(rawURL, "postgres://")
	if !ok {
		t.Fatalf("not a postgres URL: %s", rawURL)
	}
	if i := strings.IndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		rest = rest[:i]
	}
	if _, _, err := net.SplitHostPort(rest); err != nil {
		t.Fatalf("postgres URL %s: %v", rawURL, err)
	}
	return rest
}

// dialErr is devProc.Dial returning an error instead of failing the test
// (for load goroutines that reconnect).
func (p *devProc) dialErr(t *testing.T, user string) (*client, error) {
	return p.DialWith(t, user, p.Token(t, user))
}

// startReconnectingLoad is stacktest.StartLoad for faults after which the gateway
// closes devices on purpose (a stalled write, delivery fallen behind:
// "reconnect and sync"): a user whose connection closes reconnects and
// sends the same client_message_id again, as a client should, so an
// answer lost with the connection is not a lost send. It returns the load
// and the number of reconnects.
func startReconnectingLoad(t *testing.T, dev *devProc, users, convs int) (*loadGen, *atomic.Int64) {
	t.Helper()
	l := stacktest.NewLoad(t)
	reconnects := new(atomic.Int64)
	stacktest.CreateLoadConversations(t, dev.Dev, users, convs)
	for u := 0; u < users; u++ {
		user := fmt.Sprintf("lu%d", u)
		cl := dev.Dial(t, user)
		l.Go(func() {
			for i := 0; !l.Stopped(); i++ {
				conv, cmid := fmt.Sprintf("lc%d", (i+u)%convs), fmt.Sprintf("%s-%d", user, i)
				sent := time.Now()
				var r *protocol.Reply
				var err error
				for start := time.Now(); ; {
					if r, err = cl.SendRetrying(conv, cmid, "load"); err == nil || time.Since(start) > time.Minute || l.Stopped() {
						break
					}
					// the connection closed: reconnect and send again
					time.Sleep(100 * time.Millisecond)
					if c, derr := dev.dialErr(t, user); derr == nil {
						cl = c
						reconnects.Add(1)
					}
				}
				if err != nil || r.Op != protocol.OpAccepted {
					if !l.Stopped() {
						t.Errorf("load send %s: %+v %v", cmid, r, err)
					}
					return
				}
				l.Record(acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: user, Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
			}
		})
	}
	l.StopOnCleanup()
	return l, reconnects
}
