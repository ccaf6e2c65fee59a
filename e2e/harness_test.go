// Package e2e holds the end-to-end tests: TestMain builds the chatpipe
// binary (with -race unless CHATPIPE_E2E_NORACE is set, and with the
// chatpipe_faults fault points), and the tests drive real `chatpipe dev`
// processes over real sockets, including fault tests that pause, kill and
// add processes; each ends by checking the world (docs/operations.md, "Fault
// tests").
package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/twmb/franz-go/pkg/kgo"

	chatclient "github.com/chatpipe/chatpipe/client"
	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/testdeadline"
	"github.com/chatpipe/chatpipe/protocol"
)

var binary string

// defaultParallel is how many of the tests marked parallel run at once
// when go test is given no -parallel (its own default is GOMAXPROCS, 2
// here). Two at a time kept the machine under half busy on the
// developers' 2-core machine: those tests mostly wait on a lease, a
// timeout or a fault. CHATPIPE_E2E_PARALLEL sets another number.
const defaultParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	if err := setParallel(os.Getenv("CHATPIPE_E2E_PARALLEL")); err != nil {
		panic(err)
	}
	if v := os.Getenv("CHATPIPE_E2E_TEST_DEADLINE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			panic(fmt.Sprintf("CHATPIPE_E2E_TEST_DEADLINE=%q: want a positive duration such as 10m", v))
		}
		testDeadline = d
	}
	dir, err := os.MkdirTemp("", "chatpipe-e2e-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "chatpipe")
	testdeadline.AtExit(func() { os.RemoveAll(dir) })
	// The fault points (shardworker/faults_on.go) are compiled in but stay
	// off unless a test sets their environment variables.
	build := exec.Command("go", "build", "-race", "-tags", "chatpipe_faults", "-o", binary, "../cmd/chatpipe")
	if os.Getenv("CHATPIPE_E2E_NORACE") != "" {
		build = exec.Command("go", "build", "-tags", "chatpipe_faults", "-o", binary, "../cmd/chatpipe")
	}
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		panic("build chatpipe: " + err.Error())
	}
	// Every dev stack's Postgres cluster is a copy of one initdb'd here
	// (devstack.PreparePGTemplate), not an initdb of its own.
	if os.Getenv("CHATPIPE_PG_TEMPLATE") == "" {
		tpl := filepath.Join(dir, "pg-template")
		if err := os.Mkdir(tpl, 0o700); err != nil {
			panic(err)
		}
		if err := devstack.PreparePGTemplate(context.Background(), tpl, nil); err != nil {
			panic("postgres template: " + err.Error())
		}
		os.Setenv("CHATPIPE_PG_TEMPLATE", tpl)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// setParallel sets go test's -parallel to env's number (defaultParallel
// if env is empty), unless -parallel was given.
func setParallel(env string) error {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if given {
		return nil
	}
	n := defaultParallel
	if env != "" {
		var err error
		if n, err = strconv.Atoi(env); err != nil || n < 1 {
			return fmt.Errorf("CHATPIPE_E2E_PARALLEL=%q: want a positive number", env)
		}
	}
	return flag.Set("test.parallel", strconv.Itoa(n))
}

// parallel lets t run beside other such tests (defaultParallel at once)
// once the tests that run alone are done. It marks the tests that mostly
// wait (on a lease's TTL, a transaction timeout, a proxy's fault, a
// token's expiry) or do little. Load, fault schedules, the reconnect storm
// and the compose stack still run alone, so that no timing they depend on
// is stretched by a neighbour. CHATPIPE_E2E_SERIAL=1 runs every test
// alone.
func parallel(t *testing.T) {
	if os.Getenv("CHATPIPE_E2E_SERIAL") == "" {
		t.Parallel()
	}
	watch(t) // from here: a parallel test's clock starts when it may run
}

// testDeadline is each e2e test's own deadline, far below the package's
// -timeout (60 minutes in the README's command): the slowest test takes
// about 70 s alone under -race. CHATPIPE_E2E_TEST_DEADLINE sets another
// (for a test's longer variants, e.g. CHATPIPE_E2E_KICK_CYCLES=10000);
// TestMain reads it.
var testDeadline = 5 * time.Minute

// watch arms t's own deadline on the first call (startDev, startProc,
// parallel and waitFor call it): past it the test binary prints the test,
// the waits it is in (waitFor's what) and the goroutines' stacks, and
// exits (internal/testdeadline).
func watch(t *testing.T) *testdeadline.Watch {
	return testdeadline.For(t, testDeadline)
}

// long skips t unless CHATPIPE_E2E_LONG=1: the runs that take minutes by
// design (the nemesis's fault schedule) stay out of the README's test
// command and run where they are asked for (.ci/run runs them after it,
// tools/scripts/flaky.sh sets it).
func long(t *testing.T) {
	t.Helper()
	if os.Getenv("CHATPIPE_E2E_LONG") != "1" {
		t.Skip("a long run: CHATPIPE_E2E_LONG=1 runs it (.ci/run does, after the README's test command)")
	}
}

// endpoints mirrors what `chatpipe dev` writes to endpoints.json.
type endpoints struct {
	WebSocket  string   `json:"websocket"`
	HTTP       string   `json:"http"`
	Kafka      []string `json:"kafka"`
	Topic      string   `json:"topic"`
	Postgres   string   `json:"postgres"`
	Etcd       []string `json:"etcd"`
	VShards    int      `json:"vshards"`
	Partitions int      `json:"partitions"`
	Dedicated  int      `json:"dedicated"`
	PID        int      `json:"pid"`
	Admin      string   `json:"admin"`

	// Not in endpoints.json: what the test's own Kafka and etcd clients
	// need against the secured stack (its reader's TLS and SASL, an etcd
	// client certificate); nil against a plaintext one.
	kafkaOpts []kgo.Opt
	etcdTLS   *tls.Config
}

// all is the number of vshards with an owner row: the hashed ones and the
// dedicated ones after them.
func (ep endpoints) all() int { return ep.VShards + ep.Dedicated }

// devProc is a running `chatpipe dev` process.
type devProc struct {
	t      *testing.T
	dir    string
	cmd    *exec.Cmd
	ep     endpoints
	secret []byte
	done   chan struct{}
	logf   *os.File
}

// testVShards is the hashed vshards of a test's dev stack, a quarter of
// dev's default of 64: each vshard's writer fences and loads on every
// start and takeover, so 16 make a stack start and a worker take over
// sooner, and still spread a test's conversations over both workers and
// every partition (8). A test's own --vshards comes later and wins: the
// nemesis and the etcd leader stall's takeover storm, whose point is many
// writers at once, and TestInitAndConfig, which checks dev's default
// shape, ask for 64.
const testVShards = 16

// startDev runs `chatpipe dev` on dir and waits until endpoints.json appears.
func startDev(t *testing.T, dir string, args ...string) *devProc {
	t.Helper()
	watch(t) // before p.stop's clean-up, so that the deadline covers it
	epPath := filepath.Join(dir, "endpoints.json")
	os.Remove(epPath)
	logf, err := os.OpenFile(filepath.Join(dir, "dev.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	// CHATPIPE_E2E_DEV_ARGS adds flags to every dev process (for measuring
	// variants, e.g. "--delivery-listen=false --delivery-poll 50ms").
	args = append(args, strings.Fields(os.Getenv("CHATPIPE_E2E_DEV_ARGS"))...)
	base := []string{"dev", "--data-dir", dir, "--http", "127.0.0.1:0", "--log-level", "warn", "--vshards", strconv.Itoa(testVShards)}
	cmd := exec.Command(binary, append(base, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &devProc{t: t, dir: dir, cmd: cmd, done: make(chan struct{}), logf: logf}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(p.stop)
	defer watch(t).Waiting(fmt.Sprintf("chatpipe dev (pid %d) to write %s", cmd.Process.Pid, epPath))()
	deadline := time.Now().Add(90 * time.Second)
	for {
		b, err := os.ReadFile(epPath)
		if err == nil && json.Unmarshal(b, &p.ep) == nil && p.ep.PID == cmd.Process.Pid {
			break
		}
		select {
		case <-p.done:
			t.Fatalf("chatpipe dev exited early; log:\n%s", tail(filepath.Join(dir, "dev.log")))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("chatpipe dev not ready; log:\n%s", tail(filepath.Join(dir, "dev.log")))
		}
	}
	p.secret, err = auth.LoadSecret("", dir, false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// stop sends SIGTERM and waits for a clean exit. Safe twice.
func (p *devProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	if !terminate(p.cmd.Process, p.done, 60*time.Second) {
		p.t.Errorf("chatpipe dev did not stop within 60 s of SIGTERM; its goroutines at SIGQUIT and log:\n%s", tailN(filepath.Join(p.dir, "dev.log"), 600))
		return
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		p.t.Errorf("chatpipe dev exited with %d; log:\n%s", code, tail(filepath.Join(p.dir, "dev.log")))
	}
	p.logf.Close()
}

func tail(path string) string { return tailN(path, 60) }

// tailN returns the last n lines of the file at path.
func tailN(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// client is one websocket device of a user that speaks the protocol as
// raw request frames (tests send malformed, retried and hostile frames on
// purpose), on the client package's connection multiplexer.
type client struct {
	t    *testing.T
	user string
	c    *chatclient.Conn
}

func (p *devProc) token(t *testing.T, user string) string {
	tok, err := auth.Mint(p.secret, user, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (p *devProc) dial(t *testing.T, user string) *client {
	t.Helper()
	cl, err := p.dialWith(t, user, p.token(t, user))
	if err != nil {
		t.Fatalf("dial as %s: %v", user, err)
	}
	return cl
}

// dialWith opens a websocket of `chatpipe dev` as user with the bearer
// token tok; the test's cleanup closes it.
func (p *devProc) dialWith(t *testing.T, user, tok string) (*client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := chatclient.DialConn(ctx, p.ep.WebSocket, chatclient.ConnOptions{Token: tok, ReadLimit: 1 << 20,
		OnFrame: func(b []byte) {
			if !json.Valid(b) {
				t.Errorf("bad frame from server: %s", b)
			}
		}})
	if err != nil {
		return nil, err
	}
	cl := &client{t: t, user: user, c: c}
	t.Cleanup(cl.close)
	return cl, nil
}

func (cl *client) close() { cl.c.CloseNow() }

// do sends a request (fields as a map; "id" is set here) and waits for its reply.
func (cl *client) do(req map[string]any) (*protocol.Reply, error) {
	id := cl.c.NewID()
	req["id"] = id
	b, _ := json.Marshal(req)
	return cl.doFrame(id, string(b))
}

// doFrame writes a raw frame whose id is id and waits for its reply.
func (cl *client) doFrame(id, frame string) (*protocol.Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := cl.c.Call(ctx, id, []byte(frame))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no reply to %s within 30 s", frame)
		}
		return nil, err
	}
	var r protocol.Reply
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("bad frame from server: %s", b)
	}
	if r.Op != protocol.OpAccepted && r.Op != protocol.OpRejected {
		return nil, fmt.Errorf("%s answered %s, not accepted or rejected", id, b)
	}
	return &r, nil
}

// must is do for requests that have to succeed; it waits out
// rate_limited and unavailable as a client should.
func (cl *client) must(req map[string]any) *protocol.Reply {
	cl.t.Helper()
	var r *protocol.Reply
	var err error
	for start := time.Now(); ; {
		r, err = cl.do(req)
		if err != nil {
			cl.t.Fatalf("%s: %v", cl.user, err)
		}
		if (r.Code != protocol.CodeUnavailable && r.Code != protocol.CodeRateLimited) || time.Since(start) > 90*time.Second {
			break
		}
		time.Sleep(time.Duration(r.RetryAfterMS) * time.Millisecond)
	}
	if r.Op != protocol.OpAccepted {
		cl.t.Fatalf("%s %v: %+v", cl.user, req, r)
	}
	return r
}

// sendRetrying sends until the answer is not `unavailable`, as a client should.
func (cl *client) sendRetrying(conv, cmid, body string) (*protocol.Reply, error) {
	start := time.Now()
	for {
		r, err := cl.do(map[string]any{"op": "send", "conversation_id": conv, "client_message_id": cmid, "body": body})
		if err != nil {
			return nil, err
		}
		if (r.Code != protocol.CodeUnavailable && r.Code != protocol.CodeRateLimited) || time.Since(start) > 90*time.Second {
			return r, nil
		}
		time.Sleep(time.Duration(r.RetryAfterMS) * time.Millisecond)
	}
}

// readRaw reads the next frame (for bad-input tests).
func readRaw(ctx context.Context, c *websocket.Conn) (map[string]any, error) {
	_, b, err := c.Read(ctx)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	err = json.NewDecoder(bufio.NewReader(strings.NewReader(string(b)))).Decode(&m)
	return m, err
}

// grepLines returns the lines of the file at path that contain any of
// words (at most the last 40).
func grepLines(path string, words ...string) string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	if len(out) > 40 {
		out = out[len(out)-40:]
	}
	return strings.Join(out, "\n")
}
