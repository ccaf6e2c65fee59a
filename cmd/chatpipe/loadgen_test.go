package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// loadgenFlagsOf parses args as chatpipe loadgen's command line.
func loadgenFlagsOf(t *testing.T, args ...string) (*flagSet, *loadgenFlags) {
	t.Helper()
	fs := newFlagSet("loadgen")
	f := addLoadgenFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs, f
}

// The load is the profile's, with the flags' shape; --rate wins over the
// profile's rate times --scale.
func TestLoadgenLoad(t *testing.T) {
	_, f := loadgenFlagsOf(t, "--profile", "hot", "--scale", "0.5", "--devices", "3", "--groups", "0")
	p, rate, err := f.load()
	want := loadgen.Profiles["hot"]
	if err != nil || p.Devices != 3 || p.GroupShare != 0 || p.Users != want.Users || rate != want.Rate*0.5 {
		t.Errorf("load: %+v at %v (%v); want hot with 3 devices, no groups, at half its rate", p, rate, err)
	}
	_, f = loadgenFlagsOf(t, "--scale", "0.5", "--rate", "7")
	if _, rate, _ := f.load(); rate != 7 {
		t.Errorf("--rate 7 --scale 0.5: rate %v, want 7", rate)
	}
	_, f = loadgenFlagsOf(t, "--profile", "nope")
	if _, _, err := f.load(); err == nil {
		t.Error("an unknown profile: no error")
	}
}

// The stack to drive is the endpoints file's, less what flags override;
// with --ws alone no endpoints file is read.
func TestLoadgenTarget(t *testing.T) {
	dir := t.TempDir()
	ep := filepath.Join(dir, "endpoints.json")
	b, _ := json.Marshal(Endpoints{WebSocket: "ws://a/v1/ws", Kafka: []string{"k:1"}, Topic: "t", Postgres: "pg", VShards: 4})
	if err := os.WriteFile(ep, b, 0o644); err != nil {
		t.Fatal(err)
	}
	fs, f := loadgenFlagsOf(t, "--endpoints", ep, "--topic", "t2")
	st, secretDir, err := f.target(fs.FlagSet)
	if err != nil || st.WebSocket != "ws://a/v1/ws" || st.Topic != "t2" || st.Postgres != "pg" || st.VShards != 4 || secretDir != dir {
		t.Errorf("target: %+v, %q, %v", st, secretDir, err)
	}
	fs, f = loadgenFlagsOf(t, "--ws", "ws://b/v1/ws")
	st, secretDir, err = f.target(fs.FlagSet)
	if err != nil || st.WebSocket != "ws://b/v1/ws" || st.Topic != "chatpipe.log" || secretDir != "" {
		t.Errorf("--ws alone: %+v, %q, %v; want the default topic and no endpoints file read", st, secretDir, err)
	}
}

// A run's name defaults to PROFILE-TIME, but not for a part of a --shard
// run, whose parts must share it.
func TestLoadgenConfig(t *testing.T) {
	_, f := loadgenFlagsOf(t, "--shard", "1/2")
	if _, err := f.config(loadgen.Profiles["peak"], 1, loadgen.Stack{}, nil, nil); err == nil {
		t.Error("--shard without --run: no error")
	}
	_, f = loadgenFlagsOf(t, "--shard", "1/2", "--run", "r", "--dup", "0", "--progress=false")
	cfg, err := f.config(loadgen.Profiles["peak"], 10, loadgen.Stack{}, nil, nil)
	if err != nil || cfg.Run != "r" || cfg.Shard.N != 2 || cfg.DupShare != -1 || cfg.Progress != nil || cfg.Rate != 10 {
		t.Errorf("config: %+v, %v", cfg, err)
	}
}
