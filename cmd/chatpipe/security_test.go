package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/link"
)

func TestLoopbackAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:0": true, "127.1.2.3:7070": true, "[::1]:7070": true, "localhost:7070": true,
		"0.0.0.0:7070": false, ":7070": false, "[::]:7070": false, "10.0.0.5:7070": false, "worker:7070": false, "bad": false,
	} {
		if got := loopbackAddr(addr); got != want {
			t.Errorf("loopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}

// linkCheck parses args into a flag set named cmd with the link flags (and
// --listen, --workers as the worker and dev have them) and runs the check.
func linkCheck(t *testing.T, cmd string, args ...string) (*linkFlags, error) {
	t.Helper()
	fs := newFlagSet(cmd)
	fs.String("listen", "127.0.0.1:0", "")
	fs.Int("workers", 2, "")
	l := addLinkFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return l, fs.checkValues()
}

// The link flags: all three or none; a worker on a non-loopback address
// needs them or --link-insecure; each command needs its own role's
// certificate; dev takes them for its gateway only.
func TestLinkFlags(t *testing.T) {
	dir := t.TempDir()
	if _, err := clustersec.WriteLinkCerts(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	tlsArgs := func(role string) []string {
		f := clustersec.LinkDir(dir, role)
		return []string{"--link-tls-ca", f.CA, "--link-tls-cert", f.Cert, "--link-tls-key", f.Key}
	}
	for _, c := range []struct {
		cmd  string
		args []string
		want string // "" : no error
	}{
		{"worker", nil, ""},
		{"worker", []string{"--listen", "0.0.0.0:7070"}, "not a loopback address"},
		{"worker", []string{"--listen", "0.0.0.0:7070", "--link-insecure"}, ""},
		{"worker", append([]string{"--listen", "0.0.0.0:7070"}, tlsArgs("worker")...), ""},
		{"worker", tlsArgs("gateway"), "chatpipe worker needs a certificate naming urn:chatpipe:link:worker"},
		{"worker", append([]string{"--link-insecure", "--listen", "0.0.0.0:7070"}, tlsArgs("worker")...), ""},
		{"worker", tlsArgs("worker")[:2], "--link-tls-cert, --link-tls-key missing"},
		{"gateway", tlsArgs("gateway"), ""},
		{"gateway", tlsArgs("worker"), "chatpipe gateway needs a certificate naming urn:chatpipe:link:gateway"},
		{"dev", tlsArgs("gateway"), "--workers 0"},
		{"dev", append([]string{"--workers", "0"}, tlsArgs("gateway")...), ""},
	} {
		l, err := linkCheck(t, c.cmd, c.args...)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s %v: %v, want %q", c.cmd, c.args, err, c.want)
		}
		if err == nil && len(c.args) > 2 && c.args[len(c.args)-2] == "--link-tls-key" && l.creds == nil {
			t.Errorf("%s %v: no credentials loaded", c.cmd, c.args)
		}
	}
	if _, err := linkCheck(t, "gateway", "--link-tls-ca", filepath.Join(dir, "none.pem"), "--link-tls-cert", "x", "--link-tls-key", "y"); err == nil {
		t.Error("a missing CA file is no error")
	}
}

// --link-insecure with --link-tls-* is the switch-over mode: TLS and
// plaintext links both served.
func TestLinkFlagsSwitchOver(t *testing.T) {
	dir := t.TempDir()
	if _, err := clustersec.WriteLinkCerts(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	f := clustersec.LinkDir(dir, "worker")
	tlsArgs := []string{"--link-tls-ca", f.CA, "--link-tls-cert", f.Cert, "--link-tls-key", f.Key}
	for _, c := range []struct {
		args           []string
		tls, plaintext bool
	}{
		{nil, false, false},
		{tlsArgs, true, false},
		{append([]string{"--link-insecure"}, tlsArgs...), true, true},
	} {
		l, err := linkCheck(t, "worker", c.args...)
		if err != nil {
			t.Fatal(err)
		}
		var wc link.Config
		l.apply(&wc)
		if (wc.TLS != nil) != c.tls || wc.AllowPlaintext != c.plaintext {
			t.Errorf("%v: TLS %v, AllowPlaintext %v; want %v, %v", c.args, wc.TLS != nil, wc.AllowPlaintext, c.tls, c.plaintext)
		}
	}
}
