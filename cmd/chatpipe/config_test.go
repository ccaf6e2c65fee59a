package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"abc", "", 3}, {"max-body-byte", "max-body-bytes", 1}, {"kafak", "kafka", 2}, {"flaw", "lawn", 2}} {
		if got := editDistance(c.a, c.b); got != c.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.d)
		}
	}
}

// newTestFlags is a flag set like a role's: a few flags with range checks.
func newTestFlags(name string) (*flag.FlagSet, *int, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := fs.Int("send-buffer", 1024, "")
	s := fs.String("topic", "chatpipe.log", "")
	fs.Float64("rate-user", 20, "")
	checkFlags(fs, atLeast("send-buffer", 1), nonZero("rate-user", "no limit"))
	return fs, n, s
}

func TestCheckEnv(t *testing.T) {
	fs, _, _ := newTestFlags("worker")
	notes, err := checkEnv(fs, []string{
		"HOME=/root", "CHATPIPE_SEND_BUFFER=3", "CHATPIPE_E2E_NORACE=1", "CHATPIPE_FAULT_ACCEPT_DELAY=1s",
		"CHATPIPE_ARTIFACTS=/tmp", "CHATPIPE_MAX_BODY_BYTES=10",
	})
	if err != nil {
		t.Fatalf("checkEnv: %v", err)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "CHATPIPE_MAX_BODY_BYTES is not read by chatpipe worker") {
		t.Errorf("notes = %q, want one on CHATPIPE_MAX_BODY_BYTES (a flag of other commands)", notes)
	}
	_, err = checkEnv(fs, []string{"CHATPIPE_SEND_BUFER=3", "CHATPIPE_NOTHING_LIKE_THIS=1"})
	if err == nil {
		t.Fatal("checkEnv accepted unknown variables")
	}
	for _, want := range []string{
		"unknown environment variable CHATPIPE_SEND_BUFER", "did you mean CHATPIPE_SEND_BUFFER?",
		"unknown environment variable CHATPIPE_NOTHING_LIKE_THIS",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestBadValues(t *testing.T) {
	t.Setenv("CHATPIPE_SEND_BUFFER", "lots")
	fs, _, _ := newTestFlags("worker")
	if err := parse(fs, nil); err == nil || err.Error() != `CHATPIPE_SEND_BUFFER="lots": not a valid int for --send-buffer` {
		t.Errorf("bad variable: err = %v", err)
	}
	t.Setenv("CHATPIPE_SEND_BUFFER", "")
	fs, _, _ = newTestFlags("worker")
	err := parse(fs, []string{"--config", writeFile(t, "rate-user = fast\n")})
	if err == nil || !strings.Contains(err.Error(), `chatpipe.conf:1: rate-user = "fast": not a valid float for --rate-user`) {
		t.Errorf("bad file value: err = %v", err)
	}
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "chatpipe.conf")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestParsePrecedence(t *testing.T) {
	path := writeFile(t, "# a comment\n\nsend-buffer = 7\ntopic \"from-file\"\n--rate-user=-1\n")

	fs, n, s := newTestFlags("worker")
	if err := parse(fs, []string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	if *n != 7 || *s != "from-file" {
		t.Errorf("file only: send-buffer=%d topic=%q, want 7 from-file", *n, *s)
	}

	t.Setenv("CHATPIPE_SEND_BUFFER", "8")
	t.Setenv("CHATPIPE_CONFIG", path)
	fs, n, s = newTestFlags("worker")
	if err := parse(fs, nil); err != nil {
		t.Fatal(err)
	}
	if *n != 8 || *s != "from-file" {
		t.Errorf("env over file: send-buffer=%d topic=%q, want 8 from-file", *n, *s)
	}

	fs, n, _ = newTestFlags("worker")
	if err := parse(fs, []string{"--send-buffer", "9"}); err != nil {
		t.Fatal(err)
	}
	if *n != 9 {
		t.Errorf("flag over env: send-buffer=%d, want 9", *n)
	}
}

func TestConfigFileKeys(t *testing.T) {
	fs, _, _ := newTestFlags("worker")
	err := parse(fs, []string{"--config", writeFile(t, "topic x\nsend-bufer 3\n")})
	if err == nil || !strings.Contains(err.Error(), `chatpipe.conf:2: unknown key "send-bufer"`) || !strings.Contains(err.Error(), "did you mean send-buffer?") {
		t.Errorf("unknown key: err = %v", err)
	}
	// A flag of other commands only is skipped: one file may serve every role.
	fs, _, s := newTestFlags("worker")
	if err := parse(fs, []string{"--config", writeFile(t, "max-body-bytes = 10\ntopic = t\n")}); err != nil || *s != "t" {
		t.Errorf("another command's key: err = %v, topic = %q", err, *s)
	}
	fs, _, _ = newTestFlags("worker")
	if err := parse(fs, []string{"--config", filepath.Join(t.TempDir(), "missing")}); err == nil || !strings.Contains(err.Error(), "config file") {
		t.Errorf("missing file: err = %v", err)
	}
}

func TestRangeChecks(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // "" for no error
	}{
		{[]string{"--send-buffer", "0"}, "--send-buffer (CHATPIPE_SEND_BUFFER) is 0: it must be at least 1"},
		{[]string{"--rate-user", "0"}, "--rate-user (CHATPIPE_RATE_USER) is 0: it must be above 0, or negative for no limit"},
		{[]string{"--rate-user", "-1"}, ""},
		{[]string{"--send-buffer", "1"}, ""},
	} {
		fs, _, _ := newTestFlags("worker")
		err := parse(fs, c.args)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("parse %q: err = %v, want %q", c.args, err, c.want)
		}
	}
	t.Setenv("CHATPIPE_SEND_BUFFER", "0")
	fs, _, _ := newTestFlags("worker")
	if err := parse(fs, nil); err == nil || !strings.Contains(err.Error(), "CHATPIPE_SEND_BUFFER") {
		t.Errorf("zero from the environment: err = %v", err)
	}
}

// Every command must parse its flags before it does anything, or probing
// it for its flags would run it.
func TestProbesReachEveryCommand(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range probes() {
		fs, err := probe(p)
		if err != nil {
			t.Errorf("probe %q: %v", p, err)
			continue
		}
		seen[fs.Name()] = true
	}
	for _, want := range []string{"worker", "gateway", "persist", "projection", "dev", "init", "admin check-config", "loadgen merge", "client"} {
		if !seen[want] {
			t.Errorf("no probe reached chatpipe %s (reached %v)", want, seen)
		}
	}
	if cmds := knownFlags()["max-body-bytes"]; len(cmds) < 3 {
		t.Errorf("knownFlags()[max-body-bytes] = %v, want dev, gateway and worker at least", cmds)
	}
}

func TestSplitRole(t *testing.T) {
	own, role, rest, ok, err := splitRole([]string{"--min-replication", "1", "--role", "worker", "--send-buffer", "0"})
	if err != nil || !ok || role != "worker" || strings.Join(own, " ") != "--min-replication 1" || strings.Join(rest, " ") != "--send-buffer 0" {
		t.Errorf("splitRole: %q %q %q %v %v", own, role, rest, ok, err)
	}
	if _, role, _, ok, _ := splitRole([]string{"--role=persist"}); !ok || role != "persist" {
		t.Errorf("--role=persist: %q %v", role, ok)
	}
	if _, _, _, ok, _ := splitRole([]string{"--etcd", "x"}); ok {
		t.Error("no --role: ok")
	}
	if _, _, _, _, err := splitRole([]string{"--role"}); err == nil {
		t.Error("--role without a name: no error")
	}
}
