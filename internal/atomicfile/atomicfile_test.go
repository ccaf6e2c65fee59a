package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.json")
	for _, s := range []string{"one", "two"} {
		if err := Write(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("files left: %v", ents)
	}
	b, _ := os.ReadFile(p)
	st, _ := os.Stat(p)
	if string(b) != "two" || st.Mode().Perm() != 0o600 {
		t.Fatalf("content %q, mode %v", b, st.Mode().Perm())
	}
}

func TestWriteJSON(t *testing.T) {
	p := filepath.Join(t.TempDir(), "v.json")
	if err := WriteJSON(p, map[string]int{"a": 1}, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "{\n  \"a\": 1\n}\n" {
		t.Fatalf("content %q", b)
	}
}
