package deptest

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TopLevel lists the module's top-level folders that may hold Go
// packages: the roles the design names, what users import or read, the
// simulation, the tests and the operator's kit (deploy, whose package
// holds the kit's checks). Anything else goes under internal/ (helpers
// of the product, which nothing outside the module can import) or tools/
// (the load generator, its checker, the benchmarks).
var TopLevel = []string{
	"client", "cmd", "deploy", "e2e", "gateway", "internal", "lease", "logrecord",
	"persist", "projection", "protocol", "shardworker", "sim", "tools", "web",
}

// TestTopLevelLayout fails when a package appears at the top level that
// TopLevel does not list.
func TestTopLevelLayout(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(goBin, "list", "-f", "{{.ImportPath}}", module+"/...")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	for _, p := range strings.Fields(stdout.String()) {
		rel, ok := strings.CutPrefix(p, module+"/")
		if !ok {
			t.Errorf("package %s is outside the module's folders", p)
			continue
		}
		top, _, _ := strings.Cut(rel, "/")
		if !slices.Contains(TopLevel, top) {
			t.Errorf("package %s is at the top level in %s/, which TopLevel does not list: move it under internal/ or tools/, or list it", p, top)
		}
	}
}
