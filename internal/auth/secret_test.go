package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FindSecret looks in one order for every command: --jwt-secret or
// --jwt-secret-file (not both), else the variable, else the data dir's
// file (made there only when asked); with Optional and no source, none.
func TestFindSecret(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "s")
	if err := os.WriteFile(file, []byte("  from-file \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, SecretFile), []byte("from-data-dir\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(SecretEnv, "")
	for _, tc := range []struct {
		name    string
		env     string
		s       SecretSources
		want    string
		errPart string
	}{
		{"the flag", "from-env", SecretSources{Value: "from-flag", DataDir: data}, "from-flag", ""},
		{"the file over the variable", "from-env", SecretSources{File: file, DataDir: data}, "from-file", ""},
		{"flag and file", "", SecretSources{Value: "x", File: file}, "", "exclusive"},
		{"the variable over the data dir", "from-env", SecretSources{DataDir: data}, "from-env", ""},
		{"the data dir", "", SecretSources{DataDir: data}, "from-data-dir", ""},
		{"nothing", "", SecretSources{}, "", "no JWT secret"},
		{"nothing, optional", "", SecretSources{Optional: true}, "", ""},
		{"a missing file", "", SecretSources{File: filepath.Join(dir, "missing")}, "", "--jwt-secret-file"},
	} {
		t.Setenv(SecretEnv, tc.env)
		got, err := FindSecret(tc.s)
		switch {
		case tc.errPart != "":
			if err == nil || !strings.Contains(err.Error(), tc.errPart) {
				t.Errorf("%s: %q, %v; want an error with %q", tc.name, got, err, tc.errPart)
			}
		case err != nil || string(got) != tc.want:
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	t.Setenv(SecretEnv, "")
	fresh := t.TempDir()
	key, err := FindSecret(SecretSources{DataDir: fresh, Create: true})
	if err != nil || len(key) < MinSecretBytes {
		t.Fatalf("made in the data dir: %q, %v", key, err)
	}
	again, err := FindSecret(SecretSources{DataDir: fresh})
	if err != nil || string(again) != string(key) {
		t.Fatalf("read back: %q, %v; want %q", again, err, key)
	}
}
