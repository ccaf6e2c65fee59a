package stacktest

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/auth"
)

// Endpoints mirrors what `chatpipe dev` writes to endpoints.json.
type Endpoints struct {
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

	// Not in endpoints.json: what a test's own Kafka and etcd clients
	// need against a secured stack (its reader's TLS and SASL, an etcd
	// client certificate); nil against a plaintext one.
	KafkaOpts []kgo.Opt   `json:"-"`
	EtcdTLS   *tls.Config `json:"-"`
}

// All is the number of vshards with an owner row: the hashed ones and the
// dedicated ones after them.
func (ep Endpoints) All() int { return ep.VShards + ep.Dedicated }

// Dev is a running `chatpipe dev` process.
type Dev struct {
	Dir    string    // its --data-dir, which holds endpoints.json, dev.log and the secret
	EP     Endpoints // read from endpoints.json
	Secret []byte    // the stack's token secret

	t    testing.TB
	cmd  *exec.Cmd
	done chan struct{}
	logf *os.File
}

// TestVShards is the hashed vshards of a test's dev stack, a quarter of
// dev's default of 64: each vshard's writer fences and loads on every
// start and takeover, so 16 make a stack start and a worker take over
// sooner, and still spread a test's conversations over both workers and
// every partition (8). A test's own --vshards comes later and wins: the
// nemesis and the etcd leader stall's takeover storm, whose point is many
// writers at once, and TestInitAndConfig, which checks dev's default
// shape, ask for 64.
const TestVShards = 16

// StartDev runs `chatpipe dev` on dir and waits until endpoints.json
// appears; t's clean-up stops it (Stop). CHATPIPE_E2E_DEV_ARGS adds flags
// to every dev process (for measuring variants, e.g.
// "--delivery-listen=false --delivery-poll 50ms").
func StartDev(t testing.TB, dir string, args ...string) *Dev {
	t.Helper()
	return StartDevEnv(t, dir, nil, args...)
}

// StartDevEnv is StartDev with env added to the process's environment
// (for tests that run beside others, which may not set the test binary's
// own).
func StartDevEnv(t testing.TB, dir string, env []string, args ...string) *Dev {
	t.Helper()
	binary := Binary(t)
	Watch(t) // before p.Stop's clean-up, so that the deadline covers it
	epPath := filepath.Join(dir, "endpoints.json")
	os.Remove(epPath)
	logPath := filepath.Join(dir, "dev.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	args = append(args, strings.Fields(os.Getenv("CHATPIPE_E2E_DEV_ARGS"))...)
	base := []string{"dev", "--data-dir", dir, "--http", "127.0.0.1:0", "--log-level", "warn", "--vshards", strconv.Itoa(TestVShards)}
	cmd := exec.Command(binary, append(base, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Dev{t: t, Dir: dir, cmd: cmd, done: make(chan struct{}), logf: logf}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(p.Stop)
	defer Watch(t).Waiting(fmt.Sprintf("chatpipe dev (pid %d) to write %s", cmd.Process.Pid, epPath))()
	deadline := time.Now().Add(90 * time.Second)
	for {
		b, err := os.ReadFile(epPath)
		if err == nil && json.Unmarshal(b, &p.EP) == nil && p.EP.PID == cmd.Process.Pid {
			break
		}
		select {
		case <-p.done:
			t.Fatalf("chatpipe dev exited early; log:\n%s", Tail(logPath))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("chatpipe dev not ready; log:\n%s", Tail(logPath))
		}
	}
	p.Secret, err = auth.LoadSecret("", dir, false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Stop sends SIGTERM and waits for a clean exit (Terminate). Safe twice.
func (p *Dev) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	logPath := filepath.Join(p.Dir, "dev.log")
	start := time.Now()
	if !Terminate(p.cmd.Process, p.done, 60*time.Second) {
		p.t.Errorf("chatpipe dev did not stop within 60 s of SIGTERM; its goroutines at SIGQUIT and log:\n%s", TailN(logPath, 600))
		return
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		p.t.Errorf("chatpipe dev exited with %d; log:\n%s", code, Tail(logPath))
	}
	logSlowStop(p.t, "chatpipe dev", time.Since(start))
	p.logf.Close()
}

// Token mints a bearer token for user with the stack's secret, valid for
// an hour.
func (p *Dev) Token(t testing.TB, user string) string {
	tok, err := auth.Mint(p.Secret, user, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// StartWorker runs `chatpipe worker` with id joining p's stack, with env
// added to its environment; its log is <id>.log in p.Dir.
func (p *Dev) StartWorker(t testing.TB, id string, env ...string) *Proc {
	return StartProc(t, p.Dir, id, env, "worker", "--endpoints", filepath.Join(p.Dir, "endpoints.json"), "--id", id, "--log-level", "warn")
}

// Tail returns the last 60 lines of the file at path.
func Tail(path string) string { return TailN(path, 60) }

// TailN returns the last n lines of the file at path.
func TailN(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
