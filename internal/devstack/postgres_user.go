package devstack

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// Running as root: initdb and postgres refuse to, so they run as the
// postgres OS user, who is given the data dir and a way to reach it.

// pgCredential returns the credential to run initdb and postgres with: nil
// when we are not root, else the postgres OS user's.
func pgCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(pgOSUser)
	if err != nil {
		return nil, fmt.Errorf("devstack: running as root, so postgres must run as OS user %q: %w", pgOSUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("devstack: uid of OS user %q: %w", pgOSUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("devstack: gid of OS user %q: %w", pgOSUser, err)
	}
	// An empty (non-nil) Groups drops root's supplementary groups.
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// preparePGDir creates dir and, when postgres runs as another user, hands it
// to that user and makes sure the user can reach it.
func preparePGDir(dir string, cred *syscall.Credential, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("devstack: create postgres data dir: %w", err)
	}
	if cred == nil {
		return nil
	}
	if err := ensureReachable(filepath.Dir(dir), cred, log); err != nil {
		return err
	}
	if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
		return fmt.Errorf("devstack: chown postgres data dir to %s: %w", pgOSUser, err)
	}
	return nil
}

// ensureReachable makes directory d and every ancestor of it traversable
// for cred's user (ensureTraversable).
func ensureReachable(d string, cred *syscall.Credential, log *slog.Logger) error {
	for a := d; ; a = filepath.Dir(a) {
		if err := ensureTraversable(a, cred, log); err != nil {
			return err
		}
		if a == filepath.Dir(a) {
			return nil
		}
	}
}

// ensureTraversable adds execute permission to directory d for the class
// (owner, group or other) that cred's user falls into, if missing.
func ensureTraversable(d string, cred *syscall.Credential, log *slog.Logger) error {
	fi, err := os.Stat(d)
	if err != nil {
		return fmt.Errorf("devstack: stat %s: %w", d, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("devstack: stat %s: no unix owner information", d)
	}
	mode := fi.Mode().Perm()
	var bit fs.FileMode
	switch {
	case st.Uid == cred.Uid:
		bit = 0o100
	case st.Gid == cred.Gid:
		bit = 0o010
	default:
		bit = 0o001
	}
	if mode&bit != 0 {
		return nil
	}
	// Keep setgid/sticky bits (e.g. /tmp's) when adding the x bit.
	full := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if err := os.Chmod(d, full|bit); err != nil {
		return fmt.Errorf("devstack: make %s traversable for OS user %s: %w", d, pgOSUser, err)
	}
	log.Info("made ancestor of postgres data dir traversable", "dir", d, "old_mode", mode, "new_mode", mode|bit)
	return nil
}

// chownTree gives every file under dir that is not yet owned by cred's user
// to that user (files root left behind would otherwise make postgres fail).
func chownTree(dir string, cred *syscall.Credential) error {
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // postgres files can vanish while we walk
			}
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == cred.Uid && st.Gid == cred.Gid {
			return nil
		}
		if err := os.Lchown(path, int(cred.Uid), int(cred.Gid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("devstack: chown postgres data dir to %s: %w", pgOSUser, err)
	}
	return nil
}
