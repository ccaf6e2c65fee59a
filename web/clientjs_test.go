package web

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// tsClientDir is the TypeScript client, relative to this package.
const tsClientDir = "../clients/typescript"

// TestCompiledClientIsCurrent compiles the TypeScript client's sources
// (clients/typescript/src, with its tsconfig.web.json) into a temporary
// directory and compares the result, file by file, with the copy the chat
// page loads (web/static/client, embedded in the binary). It fails when
// the committed copy differs from what the sources compile to; it skips
// only when node or the package's dev dependencies (npm ci in
// clients/typescript, which .ci/run does) are missing.
func TestCompiledClientIsCurrent(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the check of web/static/client against clients/typescript/src is skipped")
	}
	tsc := filepath.Join("node_modules", "typescript", "bin", "tsc")
	if _, err := os.Stat(filepath.Join(tsClientDir, tsc)); err != nil {
		t.Skip("clients/typescript/node_modules lacks typescript (run npm ci in clients/typescript): the check of web/static/client is skipped")
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, tsc, "-p", "tsconfig.web.json", "--outDir", out)
	cmd.Dir = tsClientDir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tsc -p tsconfig.web.json: %v\n%s", err, b)
	}
	want := readTree(t, out)
	got := readTree(t, filepath.Join("static", "client"))
	if len(want) == 0 {
		t.Fatal("tsc wrote no files")
	}
	const fix = "run `npm run build:web` in clients/typescript and commit web/static/client"
	for _, name := range sortedKeys(want) {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("web/static/client/%s is missing: %s", name, fix)
		case !bytes.Equal(g, want[name]):
			t.Errorf("web/static/client/%s differs from what clients/typescript/src compiles to: %s", name, fix)
		}
	}
	for _, name := range sortedKeys(got) {
		if _, ok := want[name]; !ok {
			t.Errorf("web/static/client/%s is not compiled from clients/typescript/src: remove it, or %s", name, fix)
		}
	}
}

// readTree returns the files under dir by their slash-separated path.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		files[filepath.ToSlash(rel)] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
