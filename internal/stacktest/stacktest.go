// Package stacktest starts chatpipe's roles as OS processes for tests that
// need a running stack: it builds the chatpipe binary once per test binary,
// runs `chatpipe dev` and workers on free ports, dials the stack as a
// client, drives load at it, reads its owners from etcd and its metrics
// from /metrics, and waits for conditions with a deadline that says what
// was being waited for. Every process is started with a parent-death
// signal and stopped gracefully when its test ends.
//
// The end-to-end tests (e2e), the ops kit's checks (deploy) and the
// benchmarks that need a stack (tools/bench) use it.
package stacktest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/testdeadline"
)

// TestDeadline is each test's own deadline (Watch), far below go test's
// -timeout for the package: the slowest end-to-end test takes about 70 s
// alone under -race. A TestMain may set another before the tests run.
var TestDeadline = 5 * time.Minute

// Watch arms t's own deadline (TestDeadline) on the first call; StartDev,
// StartProc and WaitFor call it. Past it the test binary prints the test,
// the waits it is in (WaitFor's what) and the goroutines' stacks, and
// exits (internal/testdeadline).
func Watch(t testing.TB) *testdeadline.Watch {
	return testdeadline.For(t, TestDeadline)
}

var build struct {
	once   sync.Once
	mu     sync.Mutex
	dir    string
	binary string
	err    error
}

// Build builds the chatpipe binary into a temporary directory, once per
// test binary, and returns its path. It is built with the race detector
// unless CHATPIPE_E2E_NORACE is set, and with the chatpipe_faults fault
// points (shardworker/faults_on.go), which stay off unless a test sets
// their environment variables. Unless CHATPIPE_PG_TEMPLATE is set, Build
// also initdb's one Postgres cluster there and sets CHATPIPE_PG_TEMPLATE
// to it, so that every dev stack's cluster is a copy of it
// (devstack.PreparePGTemplate), not an initdb of its own. Run removes the
// directory. Build also sets GORACE's atexit_sleep_ms to 0 for every
// process the test binary starts (QuickRaceExit).
func Build() (string, error) {
	build.once.Do(func() {
		build.binary, build.err = buildOnce()
	})
	return build.binary, build.err
}

func buildOnce() (string, error) {
	dir, err := os.MkdirTemp("", "chatpipe-stacktest-bin")
	if err != nil {
		return "", err
	}
	build.mu.Lock()
	build.dir = dir
	build.mu.Unlock()
	testdeadline.AtExit(removeBuild)
	binary := filepath.Join(dir, "chatpipe")
	args := []string{"build", "-race"}
	if os.Getenv("CHATPIPE_E2E_NORACE") != "" {
		args = args[:1]
	}
	args = append(args, "-tags", "chatpipe_faults", "-o", binary, "github.com/chatpipe/chatpipe/cmd/chatpipe")
	cmd := exec.Command("go", args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build chatpipe: %w", err)
	}
	os.Setenv("GORACE", QuickRaceExit(os.Getenv("GORACE")))
	if os.Getenv("CHATPIPE_PG_TEMPLATE") == "" {
		tpl := filepath.Join(dir, "pg-template")
		if err := os.Mkdir(tpl, 0o700); err != nil {
			return "", err
		}
		if err := devstack.PreparePGTemplate(context.Background(), tpl, nil); err != nil {
			return "", fmt.Errorf("postgres template: %w", err)
		}
		os.Setenv("CHATPIPE_PG_TEMPLATE", tpl)
	}
	return binary, nil
}

// Binary returns the chatpipe binary's path, building it on the first call
// (Build); a failed build fails t.
func Binary(t testing.TB) string {
	t.Helper()
	b, err := Build()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Run runs m's tests and returns their exit code, having removed what
// Build made. A package whose tests use this one calls it from TestMain:
// os.Exit(stacktest.Run(m)).
func Run(m *testing.M) int {
	code := m.Run()
	removeBuild()
	return code
}

// QuickRaceExit returns the GORACE options gorace with atexit_sleep_ms=0
// added, unless they set it. A program built with -race otherwise sleeps
// a second before it exits, so that other goroutines' reports are
// printed; a test that stops five processes waited five seconds for
// nothing. A race found before exit is still reported, and with the
// default halt_on_error=0 the program's exit status is still 66 when
// there was one.
func QuickRaceExit(gorace string) string {
	for _, f := range strings.Fields(gorace) {
		if strings.HasPrefix(f, "atexit_sleep_ms=") {
			return gorace
		}
	}
	return strings.TrimSpace(gorace + " atexit_sleep_ms=0")
}

func removeBuild() {
	build.mu.Lock()
	defer build.mu.Unlock()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
}
