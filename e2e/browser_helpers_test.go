package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromiumPath finds headless Chromium: $CHATPIPE_CHROMIUM, else chromium on
// PATH. Without one the test fails (CI installs Debian's chromium), unless
// CHATPIPE_E2E_NOBROWSER=1 asks to skip it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if os.Getenv("CHATPIPE_E2E_NOBROWSER") == "1" {
		t.Skip("CHATPIPE_E2E_NOBROWSER=1: browser test skipped")
	}
	if p := os.Getenv("CHATPIPE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no headless Chromium: install it (apt-get install -y chromium; .ci/run does), " +
		"point CHATPIPE_CHROMIUM at one, or set CHATPIPE_E2E_NOBROWSER=1 to skip this test")
	return ""
}

// artifactsDir returns the folder the browser test writes its screenshots
// to: $CHATPIPE_ARTIFACTS/browser, by default under the system's temp dir.
// It is emptied first and kept after the test.
func artifactsDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv("CHATPIPE_ARTIFACTS")
	if root == "" {
		root = filepath.Join(os.TempDir(), "chatpipe-artifacts")
	}
	dir := filepath.Join(root, "browser")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "browser test: screenshots in %s\n", dir)
	t.Logf("screenshots in %s", dir)
	return dir
}

// browser is one headless Chromium process driven over the DevTools
// protocol; it is stopped when the test ends.
type browser struct {
	t    *testing.T
	root context.Context // the first tab; others are its children
	dir  string          // screenshots
}

func startBrowser(t *testing.T, exe, artifacts string) *browser {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox, // root in CI
		chromedp.Flag("disable-gpu", true),
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	)...)
	root, cancel := chromedp.NewContext(alloc)
	// Cancelling the first tab's context stops the browser; the allocator's
	// cancel waits for the process to exit.
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(root); err != nil { // starts the browser
		t.Fatalf("start chromium %s: %v", exe, err)
	}
	return &browser{t: t, root: root, dir: artifacts}
}

// tab is one page of the browser.
type tab struct {
	t    *testing.T
	b    *browser
	name string
	ctx  context.Context
}

// tab opens a new tab (in a window of its own, so it renders) at url.
func (b *browser) tab(name, url string) *tab {
	b.t.Helper()
	ctx, cancel := chromedp.NewContext(b.root)
	b.t.Cleanup(cancel)
	// The first Run on a context makes its tab and binds the tab's life to
	// the context of that call: make it without a timeout.
	if err := chromedp.Do(ctx); err != nil {
		b.t.Fatalf("open a tab for %s: %v", name, err)
	}
	tb := &tab{t: b.t, b: b, name: name, ctx: ctx}
	tb.do("open "+url, chromedp.Navigate(url))
	return tb
}

// do runs actions with a bound on their time.
func (tb *tab) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.fail("%s: %v", what, err)
	}
}

func (tb *tab) setValue(sel, v string) {
	tb.t.Helper()
	tb.do("set "+sel, chromedp.SetValue(chromedp.CSS(sel), v))
}

func (tb *tab) click(sel string) {
	tb.t.Helper()
	tb.do("click "+sel, chromedp.Click(chromedp.CSS(sel)))
}

// eval evaluates a JavaScript expression in the tab and decodes its value.
func eval[T any](tb *tab, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}

// waitJS polls a JavaScript expression until check accepts its value.
func waitJS[T any](tb *tab, timeout time.Duration, what, expr string, check func(T) bool) T {
	tb.t.Helper()
	deadline := time.Now().Add(timeout)
	var (
		v   T
		err error
	)
	for {
		v, err = eval[T](tb, expr)
		if err == nil && check(v) {
			return v
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		tb.fail("timed out after %v waiting for %s: %v", timeout, what, err)
	} else {
		tb.fail("timed out after %v waiting for %s; last value %+v", timeout, what, v)
	}
	return v
}

// screenshot saves the whole page as <dir>/<name>.png.
func (tb *tab) screenshot(name string) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		tb.t.Errorf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(tb.b.dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tb.t.Errorf("screenshot %s: %v", name, err)
	}
}

// fail saves a screenshot and the page's protocol log, then fails the test.
func (tb *tab) fail(format string, args ...any) {
	tb.t.Helper()
	tb.screenshot("failed-" + tb.name)
	if log, err := eval[string](tb, `(document.querySelector('#log') || {}).textContent || ''`); err == nil && log != "" {
		tb.t.Logf("%s's protocol log (last lines):\n%s", tb.name, lastLines(log, 30))
	}
	tb.t.Fatalf("%s: %s", tb.name, fmt.Sprintf(format, args...))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// js quotes s as a JavaScript string literal.
func js(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}
