package deptest

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// listed is the part of a `go list -json` entry the package comment check
// reads.
type listed struct {
	ImportPath  string
	Name        string
	Dir         string
	GoFiles     []string
	CgoFiles    []string
	TestGoFiles []string
}

// TestPackageComments: every package of the module has a package comment
// on one of its files (test files count, for the test-only e2e): "Package
// <name> ..." for a library, any comment for a command.
func TestPackageComments(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(goBin, "list", "-json", module+"/...")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	n := 0
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		n++
		ok, err := hasPackageComment(p)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			want := `"// Package ` + p.Name + ` ..."`
			if p.Name == "main" {
				want = "a package comment"
			}
			t.Errorf("%s: no file has %s", p.ImportPath, want)
		}
	}
	if n == 0 {
		t.Fatal("go list found no packages")
	}
}

func hasPackageComment(p listed) (bool, error) {
	files := append(append(append([]string(nil), p.GoFiles...), p.CgoFiles...), p.TestGoFiles...)
	for _, name := range files {
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return false, err
		}
		if f.Doc == nil {
			continue
		}
		text := f.Doc.Text()
		if p.Name == "main" && strings.TrimSpace(text) != "" {
			return true, nil
		}
		if strings.HasPrefix(text, "Package "+p.Name+" ") || strings.HasPrefix(text, "Package "+p.Name+"\n") {
			return true, nil
		}
	}
	return false, nil
}
