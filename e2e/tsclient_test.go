package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tsClientDir is the TypeScript client, relative to this package.
const tsClientDir = "../clients/typescript"

// TestTypeScriptClient runs the TypeScript client's Node tests
// (clients/typescript/test/stack.test.ts) against a real stack with two
// workers: a send through a forced disconnect, an offline device that
// converges through sync with duplicates dropped, history right after
// create, read markers (two devices of one user see the same marker, a
// lower one is ignored, unread counts after a burst of another member's
// messages), and sends while a worker is killed. For the last one the Node
// test writes kill-worker into a control directory; this test then kills
// worker wa with kill -9 and writes worker-killed. It skips only when node
// or the package's installed dev dependencies (npm ci in
// clients/typescript, which .ci/run does) are missing.
func TestTypeScriptClient(t *testing.T) {
	sharing(t, 25, 35)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: TypeScript client test skipped")
	}
	for _, dep := range []string{"typescript/bin/tsc", "ws/package.json", "@types/node/package.json"} {
		if _, err := os.Stat(filepath.Join(tsClientDir, "node_modules", dep)); err != nil {
			t.Skipf("clients/typescript/node_modules lacks %s (run npm ci in clients/typescript): TypeScript client test skipped", dep)
		}
	}
	dev := startDev(t, t.TempDir(), "--workers", "0")
	wa, _ := twoWorkers(t, dev)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	build := exec.CommandContext(ctx, node, "node_modules/typescript/bin/tsc", "-p", "tsconfig.json")
	build.Dir = tsClientDir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, out)
	}

	control := t.TempDir()
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for {
			if _, err := os.Stat(filepath.Join(control, "kill-worker")); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		wa.Kill9()
		os.WriteFile(filepath.Join(control, "worker-killed"), []byte(time.Now().UTC().Format(time.RFC3339Nano)+"\n"), 0o644)
	}()

	cmd := exec.CommandContext(ctx, node, "--test", "--test-concurrency=1", "--test-reporter=tap", "dist/test/")
	cmd.Dir = tsClientDir
	cmd.Env = append(os.Environ(),
		"CHATPIPE_WS_URL="+dev.EP.WebSocket,
		"CHATPIPE_JWT_SECRET="+string(dev.Secret),
		"CHATPIPE_CONTROL_DIR="+control,
		fmt.Sprintf("CHATPIPE_RUN=%d", time.Now().UnixNano()),
		"CHATPIPE_E2E_REQUIRED=1",
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	t.Logf("node --test (%v):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatalf("the TypeScript client's tests failed: %v", err)
	}
	if !strings.Contains(out.String(), "\n# skipped 0\n") {
		t.Fatal("some TypeScript client tests were skipped")
	}
	select {
	case <-killed:
	case <-time.After(time.Second):
		t.Fatal("the Node test never asked for the worker kill")
	}
	if _, err := os.Stat(filepath.Join(control, "worker-killed")); err != nil {
		t.Fatal("worker wa was not killed during the Node test")
	}
}
