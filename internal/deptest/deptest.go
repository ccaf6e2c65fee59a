// Package deptest holds checks on the module's structure, run by its tests
// against `go list` output.
//
// Check keeps the pure packages (protocol, logrecord, internal/shardcore,
// internal/ownership, internal/jsonenc, and sim, which runs them) to what they are allowed to depend
// on: the standard library less the I/O packages in Forbidden, the
// third-party packages named in their rule, and other pure packages. The
// etcd side of ownership (lease) is not pure and is not covered.
//
// TestPackageComments requires a package comment on every package.
package deptest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

const module = "github.com/chatpipe/chatpipe"

// Pure maps each pure package to the non-standard packages it may import.
// An entry allows that import path and everything below it. An entry that
// is itself a key of Pure also allows what that package is allowed.
var Pure = map[string][]string{
	module + "/internal/jsonenc": {},
	// How long a batcher lingers: durations in, a duration out.
	module + "/internal/groupcommit": {},
	module + "/protocol":             {"github.com/go-json-experiment/json", module + "/internal/jsonenc"},
	module + "/logrecord":            {"github.com/go-json-experiment/json", module + "/internal/jsonenc"},
	module + "/internal/shardcore": {
		module + "/internal/groupcommit",
		module + "/protocol",
		module + "/logrecord",
		"golang.org/x/time/rate",
		"github.com/bits-and-blooms/bloom/v3",
		"github.com/bits-and-blooms/bitset",
	},
	module + "/internal/ownership": {},
	// The read model's pure rules: what a batch does to membership
	// periods, and who may see which seq.
	module + "/internal/readmodel": {module + "/logrecord"},
	// The simulation runs the real writer and planner against stand-ins:
	// no client of Kafka, etcd or Postgres gets into it.
	module + "/sim": {
		module + "/protocol",
		module + "/logrecord",
		module + "/internal/shardcore",
		module + "/internal/ownership",
		module + "/internal/readmodel",
	},
}

// Forbidden lists packages no pure package may depend on, even indirectly,
// whatever its rule says. An entry forbids that import path and everything
// below it, except "net", which forbids only itself (net/http is listed on
// its own).
var Forbidden = []string{
	"go.etcd.io",
	"github.com/twmb/franz-go",
	"github.com/jackc/pgx",
	"net",
	"net/http",
	"os/exec",
	"database/sql",
}

// Package is the part of a `go list -json` entry the check reads.
type Package struct {
	ImportPath string
	Standard   bool
	DepOnly    bool
	Imports    []string
	Deps       []string
}

// Decode reads the stream of JSON objects `go list -json` prints.
func Decode(r io.Reader) ([]Package, error) {
	var pkgs []Package
	dec := json.NewDecoder(r)
	for {
		var p Package
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			return pkgs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decoding go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// Check returns an error naming every dependency of a package in rules that
// is forbidden or not allowed. pkgs must hold the packages of rules and all
// their dependencies, as `go list -deps -json` prints them.
func Check(pkgs []Package, rules map[string][]string) error {
	byPath := make(map[string]Package, len(pkgs))
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
	}
	var problems []string
	roots := make([]string, 0, len(rules))
	for r := range rules {
		roots = append(roots, r)
	}
	sort.Strings(roots)
	for _, root := range roots {
		p, ok := byPath[root]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: not in the package list", root))
			continue
		}
		allowed := allowedFor(root, rules)
		for _, dep := range p.Deps {
			d, ok := byPath[dep]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: dependency %s is not in the package list", root, dep))
				continue
			}
			switch {
			case forbidden(dep):
				problems = append(problems, fmt.Sprintf("%s depends on %s, which is forbidden%s", root, dep, importedBy(dep, p, byPath)))
			case !d.Standard && !matchesAny(dep, allowed):
				problems = append(problems, fmt.Sprintf("%s depends on %s, which is not in its allow-list%s", root, dep, importedBy(dep, p, byPath)))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// allowedFor is root's own rule plus the rules of the pure packages it may
// import, transitively.
func allowedFor(root string, rules map[string][]string) []string {
	seen := map[string]bool{root: true}
	allowed := []string{root}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, a := range rules[p] {
			if seen[a] {
				continue
			}
			seen[a] = true
			allowed = append(allowed, a)
			if _, pure := rules[a]; pure {
				queue = append(queue, a)
			}
		}
	}
	return allowed
}

func forbidden(path string) bool {
	for _, f := range Forbidden {
		if path == f || (f != "net" && strings.HasPrefix(path, f+"/")) {
			return true
		}
	}
	return false
}

func matchesAny(path string, prefixes []string) bool {
	for _, a := range prefixes {
		if path == a || strings.HasPrefix(path, a+"/") {
			return true
		}
	}
	return false
}

// importedBy names the packages in root's build that import dep directly.
func importedBy(dep string, root Package, byPath map[string]Package) string {
	var by []string
	for _, q := range append([]string{root.ImportPath}, root.Deps...) {
		for _, imp := range byPath[q].Imports {
			if imp == dep {
				by = append(by, q)
				break
			}
		}
	}
	if len(by) == 0 {
		return ""
	}
	return " (imported by " + strings.Join(by, ", ") + ")"
}
