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
	"github.com/chatpipe/chatpipe/internal/testsched"
)

// binary is the chatpipe binary TestMain builds (stacktest.Build).
var binary string

// defaultCapacity is how busy, in percent of the machine (100: every core
// busy), the tests running at once may together keep it, each counted by
// its share (parallel, sharing, alone). Above 100 because a share is what
// a test keeps busy over its whole run, and its busy moments are short.
// On the developers' 2-core machine the tests, run one at a time, kept it
// 10 to 77 % busy, most of them under 40 %: they wait on leases,
// transaction timeouts and faults. CHATPIPE_E2E_CAPACITY sets another.
const defaultCapacity = 150

// pool shares the machine among the tests (TestMain makes it).
var pool *testsched.Pool

func TestMain(m *testing.M) {
	flag.Parse()
	capacity, err := capacityFrom(os.Getenv("CHATPIPE_E2E_CAPACITY"))
	if err != nil {
		panic(err)
	}
	// The pool, not go test's count of tests, decides what runs at once;
	// a -parallel given on the command line still caps the count.
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", "128")
	}
	// Settling 200 ms lets every test go test releases at once be ranked
	// before the first starts; a share passed over for 20 s stops smaller
	// ones from starting past it.
	pool = testsched.New(capacity, 200*time.Millisecond, 20*time.Second)
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
	if binary, err = stacktest.Build(); err != nil {
		panic(err)
	}
	os.Exit(stacktest.Run(m))
}

// capacityFrom parses CHATPIPE_E2E_CAPACITY (defaultCapacity if empty).
func capacityFrom(env string) (int, error) {
	if env == "" {
		return defaultCapacity, nil
	}
	n, err := strconv.Atoi(env)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("CHATPIPE_E2E_CAPACITY=%q: want a positive number (percent of the machine)", env)
	}
	return n, nil
}

// lightShare is the share of a test that mostly waits or does little:
// the 51 such tests kept the machine 40 % busy four at a time.
const lightShare = 10

// parallel runs t beside other tests with a light share of the machine.
func parallel(t *testing.T) { sharing(t, lightShare, 0) }

// sharing runs t beside other tests once busy (the percent of the
// machine t keeps busy when it runs alone) fits in what the running ones
// leave. secs is how long t takes alone, roughly: the longest start first,
// so that none of them starts last. CHATPIPE_E2E_SERIAL=1 runs every test
// alone. The test's clock (watch) starts when it may run; its share is
// given back after its clean-ups, once its processes are stopped.
func sharing(t *testing.T, busy, secs int) {
	t.Helper()
	if os.Getenv("CHATPIPE_E2E_SERIAL") != "" {
		busy = pool.Capacity()
	}
	t.Parallel()
	asked := time.Now()
	release, err := pool.Acquire(context.Background(), t.Name(), busy, secs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release) // the first clean-up registered runs last
	// What ran beside it, for a failure that might come from a neighbour.
	t.Logf("started with %d%% of %d%% after %v; beside it: %s", busy, pool.Capacity(),
		time.Since(asked).Round(100*time.Millisecond), strings.Join(pool.Running(t.Name()), ", "))
	watch(t)
}

// alone runs t with nothing beside it: for the tests that bound how long
// the product takes to answer or to notice a fault, which a neighbour's
// load would stretch. secs is as for sharing.
func alone(t *testing.T, secs int) {
	t.Helper()
	sharing(t, pool.Capacity(), secs)
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
