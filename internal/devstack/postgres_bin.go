package devstack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Which PostgreSQL binaries run the cluster, and the environment they run
// with.

// pgEnv is the environment for initdb and postgres: ours minus libpq and
// locale variables that would change how the cluster is set up.
func pgEnv() []string {
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "LC_") || k == "LANG" || k == "LANGUAGE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// PostgresBinDir returns the directory of the PostgreSQL binaries
// StartPostgres runs (initdb, postgres and their companions such as
// pg_isready): $CHATPIPE_PG_BIN if set, else the newest
// /usr/lib/postgresql/*/bin, else `pg_config --bindir` from PATH.
func PostgresBinDir(ctx context.Context) (string, error) { return pgBinDir(ctx) }

// pgBinDir finds the directory holding initdb and postgres.
func pgBinDir(ctx context.Context) (string, error) {
	if d := os.Getenv("CHATPIPE_PG_BIN"); d != "" {
		if !isExecutable(filepath.Join(d, "postgres")) {
			return "", fmt.Errorf("devstack: CHATPIPE_PG_BIN=%s has no postgres binary", d)
		}
		return d, nil
	}
	if cands, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(cands) > 0 {
		slices.SortFunc(cands, func(a, b string) int {
			return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
		})
		for _, d := range cands {
			if isExecutable(filepath.Join(d, "postgres")) && isExecutable(filepath.Join(d, "initdb")) {
				return d, nil
			}
		}
	}
	out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output()
	if err != nil {
		return "", fmt.Errorf("devstack: no PostgreSQL binaries found (set CHATPIPE_PG_BIN, install postgresql, or put pg_config on PATH): pg_config --bindir: %w", err)
	}
	d := strings.TrimSpace(string(out))
	if !isExecutable(filepath.Join(d, "postgres")) {
		return "", fmt.Errorf("devstack: pg_config --bindir says %s, which has no postgres binary", d)
	}
	return d, nil
}

// compareVersions compares dotted numeric versions like "9.6" and "15".
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return strings.Compare(a, b)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
