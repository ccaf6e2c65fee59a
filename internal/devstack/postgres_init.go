package devstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// A new cluster: initdb, or a copy of the template cluster
// CHATPIPE_PG_TEMPLATE names.

// initPGCluster runs initdb in dir unless dir already holds a cluster; a
// templated setup's cluster is a copy of CHATPIPE_PG_TEMPLATE's if that is
// set.
func initPGCluster(ctx context.Context, bin, dir string, cred *syscall.Credential, setup PostgresSetup, templated bool, log *slog.Logger) error {
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("devstack: check postgres data dir: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("devstack: read postgres data dir: %w", err)
	}
	if len(entries) > 0 {
		names := make([]string, 0, 5)
		for _, e := range entries[:min(len(entries), 5)] {
			names = append(names, e.Name())
		}
		return fmt.Errorf("devstack: postgres data dir %s is not empty but holds no cluster (no PG_VERSION; found %s); remove it or use an empty dir", dir, strings.Join(names, ", "))
	}
	if tpl := os.Getenv(pgTemplateEnv); tpl != "" && templated {
		if _, err := os.Stat(filepath.Join(tpl, "PG_VERSION")); err != nil {
			return fmt.Errorf("devstack: %s=%s holds no cluster: %w", pgTemplateEnv, tpl, err)
		}
		log.Debug("copying postgres cluster template", "dir", dir, "template", tpl)
		return copyTree(tpl, dir)
	}
	return runInitdb(ctx, bin, dir, cred, setup, log)
}

// pgTemplateEnv names a directory holding a cluster made by
// PreparePGTemplate (tests set it): a new cluster is a copy of it, in a
// tenth of initdb's time.
const pgTemplateEnv = "CHATPIPE_PG_TEMPLATE"

// PreparePGTemplate initializes a cluster in the empty directory dir, as
// StartPostgres would, for CHATPIPE_PG_TEMPLATE: the end-to-end tests
// start dozens of dev stacks, and copying a cluster costs a fraction of
// initdb. The cluster holds the chatpipe database already: its CREATE
// DATABASE (a checkpoint) was about a second of each stack's start. The
// schema is left to the stack, whose migrations take some 70 ms there.
func PreparePGTemplate(ctx context.Context, dir string, log *slog.Logger) error {
	startLog := log
	log = orDefault(log).With("component", "postgres")
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("devstack: postgres template: %w", err)
	}
	bin, err := pgBinDir(ctx)
	if err != nil {
		return err
	}
	cred, err := pgCredential()
	if err != nil {
		return err
	}
	if err := preparePGDir(dir, cred, log); err != nil {
		return err
	}
	if err := runInitdb(ctx, bin, dir, cred, PostgresSetup{}.withDefaults(), log); err != nil {
		return err
	}
	p, err := StartPostgres(ctx, dir, 0, startLog) // creates the database
	if err != nil {
		return fmt.Errorf("devstack: postgres template: %w", err)
	}
	if err := p.Close(); err != nil {
		return fmt.Errorf("devstack: postgres template: %w", err)
	}
	// Each copy starts its own log.
	if err := os.Remove(filepath.Join(dir, pgLogFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("devstack: postgres template: %w", err)
	}
	return nil
}

// copyTree copies the directories and regular files under src into dst,
// with their modes (chownTree gives them to the server's user after).
func copyTree(src, dst string) error {
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if rel == "." {
				return nil
			}
			return os.Mkdir(to, info.Mode().Perm())
		case info.Mode().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, info.Mode().Perm())
		}
		return fmt.Errorf("%s is neither a directory nor a regular file", path)
	})
	if err != nil {
		return fmt.Errorf("devstack: copy postgres cluster template into %s: %w", dst, err)
	}
	return nil
}

// runInitdb runs initdb in the empty directory dir, as setup (with its
// defaults) says.
func runInitdb(ctx context.Context, bin, dir string, cred *syscall.Credential, setup PostgresSetup, log *slog.Logger) error {
	log.Info("initializing postgres cluster", "dir", dir, "bin", bin)
	args := []string{"-D", dir, "--auth=trust"}
	if setup.Password != "" {
		pw, err := writePGPasswordFile(setup.Password, cred, log)
		if err != nil {
			return err
		}
		defer os.Remove(pw)
		args = []string{"-D", dir, "--auth-local=trust", "--auth-host=scram-sha-256", "--pwfile=" + pw}
	}
	args = append(append(args, "-U", setup.Superuser), setup.InitdbArgs...)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), args...)
	cmd.Dir = dir
	cmd.Env = pgEnv()
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("devstack: initdb %s: %w; output:\n%s", dir, err, strings.TrimSpace(out.String()))
	}
	log.Debug("initdb done", "output", out.String())
	return nil
}

// writePGPasswordFile writes password to a new temporary file for
// initdb's --pwfile, readable by initdb's OS user only; the caller removes
// it.
func writePGPasswordFile(password string, cred *syscall.Credential, log *slog.Logger) (string, error) {
	if cred != nil {
		if err := ensureReachable(os.TempDir(), cred, log); err != nil {
			return "", err
		}
	}
	f, err := os.CreateTemp("", "chatpipe-pgpw-")
	if err != nil {
		return "", fmt.Errorf("devstack: postgres password file: %w", err)
	}
	_, err = f.WriteString(password + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && cred != nil {
		err = os.Chown(f.Name(), int(cred.Uid), int(cred.Gid))
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("devstack: postgres password file: %w", err)
	}
	return f.Name(), nil
}
