package deptest

import (
	"bytes"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// TestPurePackages runs the check on what the pure packages depend on now.
func TestPurePackages(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	args := []string{"list", "-deps", "-json"}
	for p := range Pure {
		args = append(args, p)
	}
	sort.Strings(args[3:])
	var stderr bytes.Buffer
	cmd := exec.Command(goBin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	pkgs, err := Decode(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(pkgs, Pure); err != nil {
		t.Fatal(err)
	}
}

// synthetic is a package list shaped like go list's: shardcore importing
// protocol (which imports the JSON library) and whatever extra names.
func synthetic(extra ...Package) []Package {
	core := Package{
		ImportPath: module + "/internal/shardcore",
		Imports:    []string{module + "/protocol", "sort"},
		Deps:       []string{"github.com/go-json-experiment/json", module + "/protocol", "sort"},
	}
	pkgs := []Package{
		{ImportPath: "sort", Standard: true, DepOnly: true},
		{ImportPath: "github.com/go-json-experiment/json", DepOnly: true},
		{ImportPath: module + "/protocol", DepOnly: true, Imports: []string{"github.com/go-json-experiment/json"}, Deps: []string{"github.com/go-json-experiment/json"}},
	}
	for _, e := range extra {
		core.Imports = append(core.Imports, e.ImportPath)
		core.Deps = append(core.Deps, e.ImportPath)
		e.DepOnly = true
		pkgs = append(pkgs, e)
	}
	return append(pkgs, core)
}

// The synthetic graph with golang.org/x/time/rate added is allowed; the
// rules are Pure's without logrecord, which the synthetic list lacks.
func TestCheckAllows(t *testing.T) {
	rules := map[string][]string{
		module + "/internal/shardcore": Pure[module+"/internal/shardcore"],
		module + "/protocol":           Pure[module+"/protocol"],
	}
	if err := Check(synthetic(Package{ImportPath: "golang.org/x/time/rate"}), rules); err != nil {
		t.Fatal(err)
	}
}

func TestCheckRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		dep  Package
	}{
		{"etcd client", Package{ImportPath: "go.etcd.io/etcd/client/v3"}},
		{"franz-go", Package{ImportPath: "github.com/twmb/franz-go/pkg/kgo"}},
		{"pgx", Package{ImportPath: "github.com/jackc/pgx/v5"}},
		{"net/http", Package{ImportPath: "net/http", Standard: true}},
		{"os/exec", Package{ImportPath: "os/exec", Standard: true}},
		{"database/sql", Package{ImportPath: "database/sql", Standard: true}},
		{"unlisted module", Package{ImportPath: "github.com/google/uuid"}},
		{"impure package of the module", Package{ImportPath: module + "/internal/link"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(synthetic(tc.dep), Pure)
			if err == nil {
				t.Fatalf("a dependency on %s passed", tc.dep.ImportPath)
			}
			if !strings.Contains(err.Error(), tc.dep.ImportPath) {
				t.Fatalf("error does not name %s: %v", tc.dep.ImportPath, err)
			}
		})
	}
}

// A forbidden package reached through an allowed one is still refused, and
// the error names the package that imports it.
func TestCheckRefusesIndirect(t *testing.T) {
	pkgs := synthetic()
	for i := range pkgs {
		switch pkgs[i].ImportPath {
		case "github.com/go-json-experiment/json":
			pkgs[i].Imports = []string{"net/http"}
		case module + "/internal/shardcore":
			pkgs[i].Deps = append(pkgs[i].Deps, "net/http")
		}
	}
	pkgs = append(pkgs, Package{ImportPath: "net/http", Standard: true, DepOnly: true})
	err := Check(pkgs, map[string][]string{module + "/internal/shardcore": Pure[module+"/internal/shardcore"]})
	if err == nil || !strings.Contains(err.Error(), "imported by github.com/go-json-experiment/json") {
		t.Fatalf("got %v", err)
	}
}

func TestCheckMissingRoot(t *testing.T) {
	if err := Check(nil, Pure); err == nil {
		t.Fatal("an empty package list passed")
	}
}

func TestDecode(t *testing.T) {
	pkgs, err := Decode(strings.NewReader(`{"ImportPath":"sort","Standard":true,"DepOnly":true}
{"ImportPath":"` + module + `/protocol","Imports":["sort"],"Deps":["sort"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) != 2 || !pkgs[0].Standard || !pkgs[0].DepOnly || pkgs[1].Deps[0] != "sort" {
		t.Fatalf("got %+v", pkgs)
	}
}
