package main

import (
	"strings"
	"testing"
)

func TestRoleRanges(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"worker", "--max-body-bytes", "0"}, "--max-body-bytes (CHATPIPE_MAX_BODY_BYTES) is 0"},
		{[]string{"gateway", "--max-frame-bytes", "4096"}, "--max-frame-bytes (CHATPIPE_MAX_FRAME_BYTES) is 4096: it must be at least --max-body-bytes (4096) + 1024"},
		{[]string{"gateway", "--wire-read-timeout", "1s", "--wire-ping", "2s"}, "--wire-read-timeout (CHATPIPE_WIRE_READ_TIMEOUT) is 1s: it must be above --wire-ping (2s)"},
		{[]string{"worker", "--wire-queue", "64"}, "--wire-queue (CHATPIPE_WIRE_QUEUE) is 64: it must be at least 65"},
		{[]string{"worker", "--txn-timeout", "0s"}, "--txn-timeout"},
		{[]string{"dev", "--vshards", "0"}, "--vshards"},
		{[]string{"worker", "--lease-ttl", "1"}, "--lease-ttl (CHATPIPE_LEASE_TTL) is 1: it must be at least 2"},
		{[]string{"dev", "--lease-ttl", "0"}, "--lease-ttl (CHATPIPE_LEASE_TTL) is 0"},
		{[]string{"worker", "--lease-ttl", "4"}, ""},
		{[]string{"init", "--replication-factor", "0"}, "-1 for the broker's default"},
		{[]string{"kafka", "--port", "70000"}, "--port"},
		{[]string{"worker", "--rate-conv", "-1", "--rate-user", "-1", "--linger-max", "-1ms", "--read-your-writes", "-1s", "--max-convs-per-user", "-1"}, ""},
		{[]string{"dev", "--workers", "0"}, ""},
		{[]string{"init", "--replication-factor", "-1", "--min-insync-replicas", "0"}, ""},
	} {
		_, _, err := newCommandTree().validate(c.args)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%q: err = %v, want %q", c.args, err, c.want)
		}
	}
}

// An empty --admin of a role that always serves its admin endpoints is an
// error, not every interface on a free port (which would open pprof to the
// network).
func TestEmptyAdminAddressIsRefused(t *testing.T) {
	if ln, err := listenAdmin(""); err == nil {
		ln.Close()
		t.Fatal(`listenAdmin("") listened; want an error`)
	}
	ln, err := listenAdmin("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}
