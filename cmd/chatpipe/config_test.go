package main

import (
	"context"
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

// newTestFlags is a flag set like a role's: a few flags with range checks,
// and every chatpipe command's flags as the other commands' flags.
func newTestFlags(name string) (*flagSet, *int, *string) {
	fs := newFlagSet(name)
	fs.SetOutput(io.Discard)
	n := fs.Int("send-buffer", 1024, "")
	s := fs.String("topic", "chatpipe.log", "")
	fs.Float64("rate-user", 20, "")
	fs.check(atLeast("send-buffer", 1), nonZero("rate-user", "no limit"))
	fs.known = newCommandTree().known
	return fs, n, s
}

// parse parses args for a command with the flags fs, as chatpipe does at
// start.
func parse(fs *flagSet, args []string) error {
	_, _, err := newCommand(fs, "", func(context.Context, []string) error { return nil }).parse(args)
	return err
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

// The command tree holds every command, each found by its exact name, with
// its flags declared: every flag of every command is known without running
// one.
func TestCommandTree(t *testing.T) {
	tree := newCommandTree()
	for _, path := range [][]string{
		{"worker"}, {"gateway"}, {"persist"}, {"dev"}, {"init"}, {"kafka"}, {"etcd"}, {"token"}, {"export"},
		{"check"}, {"client"}, {"probe"}, {"loadgen"}, {"loadgen", "merge"}, {"loadgen", "report"},
		{"admin", "shards"}, {"admin", "check-config"}, {"admin", "rebuild"}, {"admin", "handoff"}, {"admin", "dead-letters"},
		{"admin", "kafka-acls"}, {"admin", "hot"}, {"admin", "isolate"}, {"admin", "unisolate"},
	} {
		node, rest := tree.find(path)
		c, ok := tree.commands[node]
		if !ok || len(rest) != 0 {
			t.Errorf("chatpipe %q: found %q with %q left, want a command with flags", path, node.Name, rest)
			continue
		}
		if name := strings.Join(path, " "); c.flags.Name() != name || c.flags.Lookup("config") == nil {
			t.Errorf("chatpipe %s: flag set %q, want %q with --config", name, c.flags.Name(), name)
		}
	}
	for _, path := range [][]string{{"admin"}, {"version"}} {
		if node, rest := tree.find(path); node.Name != path[0] || len(rest) != 0 || tree.commands[node] != nil {
			t.Errorf("chatpipe %s: found %q (%q left), want a command without flags", path[0], node.Name, rest)
		}
	}
	// Names match exactly, as they always have (ffcli's own dispatch
	// ignores case).
	for _, args := range [][]string{{"Worker"}, {"admin", "Shards"}, {"loadgen", "MERGE"}} {
		node, rest := tree.find(args)
		if node.Name == strings.ToLower(args[len(args)-1]) || len(rest) != 1 {
			t.Errorf("find(%q) = %q, %q: want the name unmatched", args, node.Name, rest)
		}
	}
	if cmds := tree.known["max-body-bytes"]; len(cmds) < 3 {
		t.Errorf("known[max-body-bytes] = %v, want dev, gateway and worker at least", cmds)
	}
	if cmds := tree.known["out"]; strings.Join(cmds, ",") != "export,loadgen,loadgen merge" {
		t.Errorf("known[out] = %v, want export, loadgen and loadgen merge", cmds)
	}
	if _, ok := tree.known["config"]; ok {
		t.Error("--config is among the known flags: every command has it")
	}
}

// The usages list every command: chatpipe's its commands, admin's its
// subcommands, a second line of a summary indented under the first.
func TestUsage(t *testing.T) {
	tree := newCommandTree()
	root := rootUsage(tree.root)
	for _, want := range []string{
		"Commands:\n  dev       run everything in one process", "\n  version   print the version\n",
		"\n  admin     operator commands", "\n  persist   copy the committed log into Postgres", "\nRun 'chatpipe <command> -h'",
	} {
		if !strings.Contains(root, want) {
			t.Errorf("chatpipe's usage lacks %q:\n%s", want, root)
		}
	}
	admin, _ := tree.find([]string{"admin"})
	for _, want := range []string{
		"Usage: chatpipe admin <command> [flags]\n\nCommands:\n  shards        every vshard's owner",
		"agree\n                (--role ROLE [flags]: check that role's flags, env and config file first)\n",
	} {
		if got := groupUsage(admin); !strings.Contains(got, want) {
			t.Errorf("admin's usage lacks %q:\n%s", want, got)
		}
	}
	probe, _ := tree.find([]string{"probe"})
	if got := flagsUsage(probe); !strings.HasPrefix(got, "Usage: chatpipe probe [--timeout D] URL") || !strings.Contains(got, "  -timeout duration\n") {
		t.Errorf("probe's usage:\n%s", got)
	}
	shards, _ := tree.find([]string{"admin", "shards"})
	if got := flagsUsage(shards); !strings.HasPrefix(got, "Usage of admin shards:\n  -config string") || strings.HasSuffix(got, "\n") {
		t.Errorf("admin shards' usage:\n%s", got)
	}
}

// validate applies every source and check of a command without running
// it; a command that is run gets the same checks.
func TestValidateDoesNotRun(t *testing.T) {
	tree := newCommandTree()
	fs, notes, err := tree.validate([]string{"probe", "--timeout", "1s", "http://127.0.0.1:1/readyz"})
	if err != nil || fs.Lookup("timeout").Value.String() != "1s" || len(notes) != 0 {
		t.Errorf("validate probe: %v, notes %q", err, notes)
	}
	t.Setenv("CHATPIPE_CHUNK_SIZE", "5")
	if _, notes, err := newCommandTree().validate([]string{"loadgen", "merge", "--out", "x"}); err != nil ||
		len(notes) != 1 || !strings.Contains(notes[0], "CHATPIPE_CHUNK_SIZE is not read by chatpipe loadgen merge (it is --chunk-size of chatpipe export)") {
		t.Errorf("validate loadgen merge: %v, notes %q", err, notes)
	}
	for _, args := range [][]string{{"nosuch"}, {"admin"}, {"probe", "--timeout", "0s"}} {
		if _, _, err := newCommandTree().validate(args); err == nil {
			t.Errorf("validate %q: no error", args)
		}
	}
	if err := newCommandTree().run(context.Background(), []string{"token", "--ttl", "0s", "--user", "a"}); err == nil || !strings.Contains(err.Error(), "--ttl (CHATPIPE_TTL) is 0s") {
		t.Errorf("run token --ttl 0s: %v", err)
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
