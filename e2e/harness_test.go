// Package e2e holds the end-to-end tests: TestMain builds the chatpipe
// binary (internal/stacktest: with -race unless CHATPIPE_E2E_NORACE is set,
// and with the chatpipe_faults fault points), and the tests drive real
// `chatpipe dev` processes over real sockets, including fault tests that
// pause, kill and add processes; each ends by checking the world
// (docs/operations.md, "Fault tests").
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/internal/testdeadline"
)

// binary is the chatpipe binary TestMain builds (stacktest.Build).
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
	// Each test's own deadline (stacktest.Watch) stays far below the
	// package's -timeout (60 minutes in the README's command).
	// CHATPIPE_E2E_TEST_DEADLINE sets another (for a test's longer
	// variants, e.g. CHATPIPE_E2E_KICK_CYCLES=10000).
	if v := os.Getenv("CHATPIPE_E2E_TEST_DEADLINE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			panic(fmt.Sprintf("CHATPIPE_E2E_TEST_DEADLINE=%q: want a positive duration such as 10m", v))
		}
		stacktest.TestDeadline = d
	}
	// Built here, before any test's deadline runs, not at the first
	// test's first process.
	var err error
	if binary, err = stacktest.Build(); err != nil {
		panic(err)
	}
	os.Exit(stacktest.Run(m))
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

// watch arms t's own deadline on the first call (startDev, parallel and
// stacktest's StartProc and WaitFor call it): past it the test binary
// prints the test, the waits it is in and the goroutines' stacks, and
// exits (stacktest.Watch).
func watch(t *testing.T) *testdeadline.Watch {
	return stacktest.Watch(t)
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

// The harness's pieces are stacktest's: e2e's own tests use these
// names for its types.
type (
	endpoints   = stacktest.Endpoints
	client      = stacktest.Client
	proc        = stacktest.Proc
	loadGen     = stacktest.Load
	acceptedMsg = stacktest.Accepted
)

// devProc is a running `chatpipe dev` process, with e2e's own ways of
// reaching it.
type devProc struct{ *stacktest.Dev }

// startDev runs `chatpipe dev` on dir and waits until endpoints.json
// appears (stacktest.StartDev).
func startDev(t *testing.T, dir string, args ...string) *devProc {
	t.Helper()
	return &devProc{stacktest.StartDev(t, dir, args...)}
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
