package e2e

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// runWithEnv runs the built binary with env added to the test's own
// environment and returns its combined output and exit error.
func runWithEnv(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("chatpipe %v did not exit within 30 s (it should fail at start)", args)
	}
	return string(out), err
}

// TestConfigFailsLoudly: an unknown CHATPIPE_ variable, a config key that
// is a flag of no command and a limit of 0 stop every role at start with a
// message naming them, before it connects to anything; a variable that is
// a flag of another role only is allowed.
func TestConfigFailsLoudly(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	cases := []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"unknown variable", []string{"CHATPIPE_MAX_BODY_BYTE=100"}, []string{"worker", "--etcd", "x", "--kafka", "x", "--database-url", "x"},
			[]string{"chatpipe worker: unknown environment variable CHATPIPE_MAX_BODY_BYTE", "did you mean CHATPIPE_MAX_BODY_BYTES?"}},
		{"unknown variable, persist", []string{"CHATPIPE_NO_SUCH_SETTING=1"}, []string{"persist", "--kafka", "x", "--database-url", "x"},
			[]string{"chatpipe persist: unknown environment variable CHATPIPE_NO_SUCH_SETTING"}},
		{"zero limit flag", nil, []string{"gateway", "--etcd", "x", "--database-url", "x", "--max-body-bytes", "0"},
			[]string{"chatpipe gateway: --max-body-bytes (CHATPIPE_MAX_BODY_BYTES) is 0: it must be at least 1"}},
		{"zero limit variable", []string{"CHATPIPE_SEND_BUFFER=0"}, []string{"dev", "--data-dir", dir},
			[]string{"chatpipe dev: --send-buffer (CHATPIPE_SEND_BUFFER) is 0: it must be at least 1"}},
		{"frame smaller than body", nil, []string{"worker", "--max-frame-bytes", "1000"},
			[]string{"--max-frame-bytes (CHATPIPE_MAX_FRAME_BYTES) is 1000: it must be at least --max-body-bytes (4096) + 1024"}},
		{"unknown config key", nil, []string{"worker", "--config", writeConfigFile(t, dir, "bad.conf", "max-body-bytes = 100\nsend-bufer = 3\n")},
			[]string{"bad.conf:2: unknown key \"send-bufer\"", "did you mean send-buffer?"}},
	}
	for _, c := range cases {
		out, err := runWithEnv(t, c.env, c.args...)
		if err == nil {
			t.Errorf("%s: chatpipe %v started; output:\n%s", c.name, c.args, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output does not say %q:\n%s", c.name, w, out)
			}
		}
	}
	// A flag of another role only (compose gives every role one shared
	// environment) does not stop a role.
	out, err := runWithEnv(t, []string{"CHATPIPE_MAX_BODY_BYTES=100", "CHATPIPE_TTL=1h"}, "token", "--user", "alice", "--jwt-secret", strings.Repeat("s", 32))
	if err != nil || strings.Count(out, ".") != 2 {
		t.Errorf("token with another role's variable: %v\n%s", err, out)
	}

	// admin check-config --role checks a role's configuration without
	// starting it.
	env := []string{"CHATPIPE_SEND_BUFFER=0"}
	out, err = runWithEnv(t, env, "admin", "check-config", "--role", "gateway", "--max-body-bytes", "100")
	if err == nil || !strings.Contains(out, "✗ chatpipe gateway: --send-buffer (CHATPIPE_SEND_BUFFER) is 0") {
		t.Errorf("check-config --role gateway with CHATPIPE_SEND_BUFFER=0: %v\n%s", err, out)
	}
	out, err = runWithEnv(t, []string{"CHATPIPE_CHUNK_SIZE=5"}, "admin", "check-config", "--role-only", "--role", "worker", "--send-buffer", "8")
	if err != nil || !strings.Contains(out, "✓ chatpipe worker") || !strings.Contains(out, "CHATPIPE_CHUNK_SIZE is not read by chatpipe worker") {
		t.Errorf("check-config --role worker: %v\n%s", err, out)
	}
}

func writeConfigFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// cfgTokenTTL runs `chatpipe token` and returns its token's exp - iat.
func cfgTokenTTL(t *testing.T, env []string, args ...string) time.Duration {
	t.Helper()
	out, err := runWithEnv(t, env, append([]string{"token", "--user", "alice", "--jwt-secret", strings.Repeat("s", 32)}, args...)...)
	if err != nil {
		t.Fatalf("token %v: %v\n%s", args, err, out)
	}
	parts := strings.Split(strings.TrimSpace(out), ".")
	if len(parts) != 3 {
		t.Fatalf("token %v: not a JWT: %q", args, out)
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct{ Exp, Iat int64 }
	if err := json.Unmarshal(b, &claims); err != nil {
		t.Fatal(err)
	}
	return time.Duration(claims.Exp-claims.Iat) * time.Second
}

// TestConfigPrecedence: a flag wins over its CHATPIPE_ variable, which wins
// over the config file (given with --config or CHATPIPE_CONFIG); and a role
// runs with what its config file says.
func TestConfigPrecedence(t *testing.T) {
	sharing(t, 15, 9)
	dir := t.TempDir()
	file := writeConfigFile(t, dir, "token.conf", "# token's settings\nttl = 1h\n")
	if d := cfgTokenTTL(t, nil, "--config", file); d != time.Hour {
		t.Errorf("file: ttl %v, want 1h", d)
	}
	if d := cfgTokenTTL(t, []string{"CHATPIPE_CONFIG=" + file}); d != time.Hour {
		t.Errorf("CHATPIPE_CONFIG: ttl %v, want 1h", d)
	}
	if d := cfgTokenTTL(t, []string{"CHATPIPE_TTL=2h"}, "--config", file); d != 2*time.Hour {
		t.Errorf("env over file: ttl %v, want 2h", d)
	}
	if d := cfgTokenTTL(t, []string{"CHATPIPE_TTL=2h", "CHATPIPE_CONFIG=" + file}, "--ttl", "3h"); d != 3*time.Hour {
		t.Errorf("flag over env over file: ttl %v, want 3h", d)
	}

	// A running stack takes its limits from the file, and the environment
	// over the file: max-body-bytes 100 in the file, 200 in the variable.
	conf := writeConfigFile(t, dir, "dev.conf", "max-body-bytes = 100\nrate-user = -1\nworkers 1\n")
	dev := &devProc{stacktest.StartDevEnv(t, t.TempDir(), []string{"CHATPIPE_CONFIG=" + conf, "CHATPIPE_MAX_BODY_BYTES=200"})}
	alice := dev.Dial(t, "alice")
	alice.Must(map[string]any{"op": "create", "conversation_id": "cf", "members": []string{"bob"}})
	if r, err := alice.SendRetrying("cf", "m1", strings.Repeat("a", 150)); err != nil || r.Op != protocol.OpAccepted {
		t.Errorf("150-byte body under CHATPIPE_MAX_BODY_BYTES=200 (file: 100): %+v %v", r, err)
	}
	if r, err := alice.SendRetrying("cf", "m2", strings.Repeat("a", 250)); err != nil || r.Code != "too_large" {
		t.Errorf("250-byte body over CHATPIPE_MAX_BODY_BYTES=200: %+v %v, want too_large", r, err)
	}

	// check-config --role takes the role's settings, file included, and
	// checks the deployment with them; the file's dev-only key is a note.
	out, err := runWithEnv(t, []string{"CHATPIPE_CONFIG=" + conf}, "admin", "check-config", "--min-replication", "1",
		"--role", "worker", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"))
	for _, want := range []string{"✓ chatpipe worker", "workers is not read by chatpipe worker", "✓ etcd, Kafka and Postgres agree"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("check-config --role worker on a running stack: %v, want %q in:\n%s", err, want, out)
		}
	}
}
