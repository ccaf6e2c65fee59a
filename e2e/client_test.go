package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	chatclient "github.com/chatpipe/chatpipe/client"
	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// tcpProxy sits between a client and the gateway so a test can break the
// connection under the client: cut closes every proxied connection,
// swallow drops what the server sends (the answers are lost, the requests
// still arrive), offline refuses new connections.
type tcpProxy struct {
	t        *testing.T
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	conns   []net.Conn
	swallow bool
	offline bool
	wg      sync.WaitGroup
}

// newProxy proxies to the host of the websocket URL ws and returns the
// proxy and the URL to dial through it.
func newProxy(t *testing.T, ws string) (*tcpProxy, string) {
	t.Helper()
	u, err := url.Parse(ws)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{t: t, ln: ln, upstream: u.Host}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.offline {
			p.mu.Unlock()
			down.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			p.mu.Unlock()
			down.Close()
			continue
		}
		p.conns = append(p.conns, down, up)
		p.wg.Add(2)
		p.mu.Unlock()
		go func() { defer p.wg.Done(); io.Copy(up, down); up.Close(); down.Close() }()
		go func() { defer p.wg.Done(); p.copyDown(down, up); up.Close(); down.Close() }()
	}
}

// copyDown copies server → client, dropping the bytes while swallow is set.
func (p *tcpProxy) copyDown(down, up net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := up.Read(buf)
		if n > 0 {
			p.mu.Lock()
			drop := p.swallow
			p.mu.Unlock()
			if !drop {
				if _, werr := down.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *tcpProxy) set(swallow, offline bool) {
	p.mu.Lock()
	p.swallow, p.offline = swallow, offline
	p.mu.Unlock()
}

// cut closes every connection through the proxy.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// frameLog keeps every server frame some clients received, to validate
// them against docs/protocol.schema.json at the end of the test.
type frameLog struct {
	mu     sync.Mutex
	frames [][]byte
}

func (l *frameLog) add(b []byte) {
	l.mu.Lock()
	l.frames = append(l.frames, bytes.Clone(b))
	l.mu.Unlock()
}

const schemaURL = "https://github.com/chatpipe/chatpipe/docs/protocol.schema.json"

// check validates every frame against the schema's serverFrame.
func (l *frameLog) check(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile("../docs/protocol.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(schemaURL, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(schemaURL + "#/$defs/serverFrame")
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ops := map[string]int{}
	bad := 0
	for _, f := range l.frames {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(f))
		if err == nil {
			if m, ok := v.(map[string]any); ok {
				op, _ := m["op"].(string)
				if code, ok := m["code"].(string); ok {
					op += ":" + code
				}
				ops[op]++
			}
			err = sch.Validate(v)
		}
		if err != nil {
			if bad++; bad <= 5 {
				t.Errorf("server frame does not match the schema: %s\n%v", f, err)
			}
		}
	}
	t.Logf("%d server frames validated against the schema (%d bad): %v", len(l.frames), bad, ops)
}

// dialClient connects user through the package client at ws.
func dialClient(t *testing.T, dev *devProc, ws, user string, log *frameLog, opts chatclient.Options) *chatclient.Client {
	t.Helper()
	ts := func(context.Context) (string, error) { return auth.Mint(dev.Secret, user, time.Hour, time.Now()) }
	if log != nil {
		opts.OnFrame = log.add
	}
	if opts.BaseBackoff == 0 {
		opts.BaseBackoff = 50 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := chatclient.Dial(ctx, ws, ts, opts)
	if err != nil {
		t.Fatalf("dial as %s: %v", user, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// messageBodies counts the message events of conv in history by body.
func messageBodies(t *testing.T, ctx context.Context, c *chatclient.Client, conv string) (map[string]int, []int64) {
	t.Helper()
	evs, err := c.HistoryAll(ctx, conv, 200)
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string]int{}
	var seqs []int64
	for _, e := range evs {
		seqs = append(seqs, e.Seq)
		if e.Kind == "message" {
			bodies[e.Body]++
		}
	}
	return bodies, seqs
}

// createVisible creates conv and waits until history shows it (the read
// model trails accepted).
func createVisible(t *testing.T, ctx context.Context, c *chatclient.Client, conv string, members ...string) {
	t.Helper()
	if _, err := c.Create(ctx, conv, members...); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, 30*time.Second, conv+" in history", func() bool {
		evs, err := c.History(ctx, conv, 0, 1)
		return err == nil && len(evs) == 1
	})
}

// A send whose answer is lost with its connection is sent again on the
// next one with the same client_message_id: exactly one message.
func TestClientSendSurvivesDisconnect(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log frameLog
	px, wsURL := newProxy(t, dev.EP.WebSocket)
	alice := dialClient(t, dev, wsURL, "alice", &log, chatclient.Options{})
	bob := dialClient(t, dev, dev.EP.WebSocket, "bob", &log, chatclient.Options{Batch: true})
	createVisible(t, ctx, alice, "cl-1", "bob")

	px.set(true, false) // answers to alice are lost from here on
	type result struct {
		seq int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := alice.Send(ctx, "cl-1", "through a cut")
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{seq: r.Seq}
	}()
	// bob sees the message: it was committed, and alice has not heard.
	var seq int64
	stacktest.WaitFor(t, 30*time.Second, "bob to get the message", func() bool {
		for _, e := range bob.Messages("cl-1") {
			if e.Body == "through a cut" {
				seq = e.Seq
				return true
			}
		}
		return false
	})
	select {
	case r := <-done:
		t.Fatalf("send returned before the cut: %+v", r)
	default:
	}
	px.set(false, false)
	px.cut()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.seq != seq {
		t.Fatalf("accepted seq %d after the reconnect, bob saw %d", r.seq, seq)
	}
	if alice.Connects() < 2 {
		t.Fatalf("alice connected %d times", alice.Connects())
	}
	bodies, seqs := messageBodies(t, ctx, alice, "cl-1")
	if bodies["through a cut"] != 1 || len(seqs) != 2 {
		t.Fatalf("history after the retry: %v, seqs %v", bodies, seqs)
	}
	// The sent message also reaches alice's own view.
	if err := alice.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, 30*time.Second, "alice's view to hold the message", func() bool { return len(alice.Messages("cl-1")) == 2 })
	list, err := alice.ListConversations(ctx, 10)
	if err != nil || len(list) != 1 || list[0].ConversationID != "cl-1" || list[0].LastSeq != 2 {
		t.Fatalf("conversations: %+v, %v", list, err)
	}
	log.check(t)
}

// A device that is offline while messages are sent converges through sync
// when it comes back by itself; the events it got pushed before it went
// away come again in the sync and are delivered once.
func TestClientOfflineDeviceConverges(t *testing.T) {
	sharing(t, 15, 4)
	dev := startDev(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log frameLog
	px, wsURL := newProxy(t, dev.EP.WebSocket)
	alice := dialClient(t, dev, dev.EP.WebSocket, "alice", &log, chatclient.Options{})

	var mu sync.Mutex
	delivered := map[int64]int{}
	framesSeen := map[int64]int{}
	var blog frameLog
	bob := dialClient(t, dev, wsURL, "bob", nil, chatclient.Options{
		Batch: true,
		OnEvent: func(e chatclient.Event) {
			if e.ConversationID == "cl-2" {
				mu.Lock()
				delivered[e.Seq]++
				mu.Unlock()
			}
		},
		OnFrame: func(b []byte) {
			log.add(b)
			blog.add(b)
		},
	})
	if err := bob.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	createVisible(t, ctx, alice, "cl-2", "bob")
	const online, offline = 5, 40
	for i := range online {
		if _, err := alice.Send(ctx, "cl-2", fmt.Sprintf("m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	stacktest.WaitFor(t, 30*time.Second, "bob to get the pushes", func() bool { return len(bob.Messages("cl-2")) == 1+online })
	if cur := bob.Cursors()["cl-2"]; cur != 0 {
		t.Fatalf("bob's cursor moved to %d on pushes alone", cur)
	}

	px.set(false, true) // bob goes offline and cannot come back
	px.cut()
	for i := online; i < online+offline; i++ {
		if _, err := alice.Send(ctx, "cl-2", fmt.Sprintf("m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(bob.Messages("cl-2")); n != 1+online {
		t.Fatalf("bob got %d events while offline", n)
	}
	want := int64(1 + online + offline)
	// bob comes back once the read model holds every offline send, so his
	// sync is what brings them and moves his cursor to the end. Back
	// sooner, his sync stops at the projected seq, the rest reach him as
	// pushes, which do not move the cursor, and he holds every event with
	// his cursor short of the end until his next sync.
	stacktest.WaitForOr(t, 60*time.Second, "the read model to hold every send to cl-2", func() bool {
		h, err := alice.HistoryAll(ctx, "cl-2", 200)
		return err == nil && int64(len(h)) == want
	}, func() string {
		h, err := alice.HistoryAll(ctx, "cl-2", 200)
		return fmt.Sprintf("alice's history has %d of %d events (%v)", len(h), want, err)
	})
	px.set(false, false)
	stacktest.WaitForOr(t, 60*time.Second, "bob to converge", func() bool {
		return bob.Cursors()["cl-2"] == want && len(bob.Messages("cl-2")) == int(want)
	}, func() string {
		blog.mu.Lock()
		n := len(blog.frames)
		var last []string
		for _, f := range blog.frames[max(0, n-5):] {
			last = append(last, string(f))
		}
		blog.mu.Unlock()
		return fmt.Sprintf("bob: cursor %d, %d of %d events, %d connections; his last frames of %d:\n%s\ndev log:\n%s",
			bob.Cursors()["cl-2"], len(bob.Messages("cl-2")), want, bob.Connects(), n, strings.Join(last, "\n"), stacktest.Tail(filepath.Join(dev.Dir, "dev.log")))
	})
	view := bob.Messages("cl-2")
	for i, e := range view {
		if e.Seq != int64(i+1) {
			t.Fatalf("bob's view out of order at %d: seq %d", i, e.Seq)
		}
		if e.Kind == "message" && e.Body != fmt.Sprintf("m%d", i-1) {
			t.Fatalf("seq %d body %q", e.Seq, e.Body)
		}
	}
	hist, err := alice.HistoryAll(ctx, "cl-2", 200)
	if err != nil || len(hist) != len(view) {
		t.Fatalf("alice's history %d events (%v), bob's view %d", len(hist), err, len(view))
	}
	// Duplicates: the online pushes came again in bob's sync.
	blog.mu.Lock()
	for _, f := range blog.frames {
		var seq int64
		if bytes.Contains(f, []byte(`"op":"event"`)) && bytes.Contains(f, []byte(`"conversation_id":"cl-2"`)) {
			fmt.Sscanf(string(f[bytes.Index(f, []byte(`"seq":`))+6:]), "%d", &seq)
			framesSeen[seq]++
		}
	}
	blog.mu.Unlock()
	time.Sleep(100 * time.Millisecond) // let the deliverer finish
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for seq := int64(1); seq <= want; seq++ {
		if delivered[seq] != 1 {
			t.Errorf("seq %d delivered %d times", seq, delivered[seq])
		}
		if framesSeen[seq] > 1 {
			dups++
		}
	}
	if dups < online {
		t.Errorf("only %d seqs came twice; the test did not exercise dedupe", dups)
	}
	t.Logf("bob: %d connections, %d seqs received more than once, each delivered once", bob.Connects(), dups)
	log.check(t)
}

// Sends keep being accepted, once each, while the worker that owns their
// conversations is killed with kill -9.
func TestClientSurvivesWorkerKill(t *testing.T) {
	sharing(t, 15, 15)
	dev := startDev(t, t.TempDir(), "--workers", "0")
	wa, _ := twoWorkers(t, dev, shortLease)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var log frameLog
	alice := dialClient(t, dev, dev.EP.WebSocket, "alice", &log, chatclient.Options{})
	const convs, perConv = 8, 30
	for i := range convs {
		createVisible(t, ctx, alice, fmt.Sprintf("wk-%d", i), "bob")
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	sent := 0
	errs := make(chan error, convs)
	for i := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range perConv {
				if _, err := alice.Send(ctx, fmt.Sprintf("wk-%d", i), fmt.Sprintf("b%d", j)); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				sent++
				mu.Unlock()
			}
		}()
	}
	stacktest.WaitFor(t, 60*time.Second, "sends to flow", func() bool { mu.Lock(); defer mu.Unlock(); return sent > convs*perConv/4 })
	mu.Lock()
	t.Logf("killing wa after %d of %d sends", sent, convs*perConv)
	mu.Unlock()
	wa.Kill9()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range convs {
		conv := fmt.Sprintf("wk-%d", i)
		var bodies map[string]int
		var seqs []int64
		stacktest.WaitFor(t, 60*time.Second, conv+" in history", func() bool {
			bodies, seqs = messageBodies(t, ctx, alice, conv)
			return len(seqs) >= 1+perConv
		})
		for j := range perConv {
			if n := bodies[fmt.Sprintf("b%d", j)]; n != 1 {
				t.Errorf("%s: b%d stored %d times", conv, j, n)
			}
		}
		for k, s := range seqs {
			if s != int64(k+1) {
				t.Fatalf("%s: seqs %v", conv, seqs)
			}
		}
	}
	log.check(t)
}

// runCLI runs `chatpipe client` with script on its standard input and
// returns what it printed.
func runCLI(t *testing.T, dev *devProc, user, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "client", "--user", user, "--endpoints", filepath.Join(dev.Dir, "endpoints.json"))
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("chatpipe client as %s: %v\n%s", user, err, out.String())
	}
	return out.String()
}

// `chatpipe client` finds the dev stack from endpoints.json, mints its
// token, runs the commands and prints the events as they arrive.
func TestClientCommandLine(t *testing.T) {
	sharing(t, 10, 12)
	dev := startDev(t, t.TempDir())
	out := runCLI(t, dev, "alice", "create cli-1 bob\nwait 2s\nsend cli-1   hello   there \nbogus\nwait 2s\nhistory cli-1\nquit\n")
	t.Logf("alice:\n%s", out)
	for _, want := range []string{
		"accepted create cli-1 seq 1",
		"accepted send to cli-1 seq 2",
		"[cli-1 #1] alice created it with ",
		"[cli-1 #2] alice: hello   there\n",
		`error: unknown command "bogus"`,
		"history cli-1: 2 events",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("alice's output lacks %q", want)
		}
	}
	out = runCLI(t, dev, "bob", "wait 1s\nconvs\nsend cli-1 hi alice\nwait 1s\nread cli-1\nwait 1s\nconvs\n")
	t.Logf("bob:\n%s", out)
	for _, want := range []string{
		"[cli-1 #2] alice: hello   there\n", // from the sync at connect
		"cli-1 last_seq 2 at ",
		"read to 0, 1 unread\n",
		"accepted send to cli-1 seq 3",
		"read cli-1 up to 3\n",
		"[cli-1] read up to #3\n",
		"cli-1 last_seq 3 at ",
		"read to 3, 0 unread\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("bob's output lacks %q", want)
		}
	}
}

// `chatpipe client`'s read without SEQ marks the conversation read up to
// its last seq also before the client has any of its events (as the first
// command, before the sync at connect is done), and convs right after read
// shows the marker just set although the read model, persist slowed here,
// has it only later.
func TestClientReadMarker(t *testing.T) {
	sharing(t, 10, 12)
	dev := startDev(t, t.TempDir(), "--persist=false")
	stacktest.StartProc(t, dev.Dir, "persist", []string{"CHATPIPE_FAULT_PERSIST_SLEEP_BEFORE_COMMIT=300ms"},
		"persist", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"), "--log-level", "warn")
	out := runCLI(t, dev, "alice", "create rm-1 bob carol\nsend rm-1 one\nsend rm-1 two\nquit\n")
	if !strings.Contains(out, "accepted send to rm-1 seq 3") {
		t.Fatalf("alice's sends were not accepted:\n%s", out)
	}
	stacktest.WaitFor(t, 30*time.Second, "the read model to list rm-1 at seq 3 for bob and carol", func() bool {
		return strings.Contains(runCLI(t, dev, "bob", "convs\n"), "rm-1 last_seq 3 at ") &&
			strings.Contains(runCLI(t, dev, "carol", "convs\n"), "rm-1 last_seq 3 at ")
	})
	for _, c := range []struct{ user, script, why string }{
		{"bob", "read rm-1\nconvs\n", "read first thing, before any event of rm-1 is here"},
		{"carol", "wait 2s\nread rm-1\nconvs\n", "read once the sync at connect brought rm-1's events"},
	} {
		out := runCLI(t, dev, c.user, c.script)
		t.Logf("%s (%s):\n%s", c.user, c.why, out)
		for _, want := range []string{"read rm-1 up to 3\n", "rm-1 last_seq 3 at ", "read to 3, 0 unread\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s's output lacks %q", c.user, want)
			}
		}
		if strings.Contains(out, "error:") {
			t.Errorf("%s's commands failed", c.user)
		}
	}
}
