package shardworker

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
)

// /debug/hot answers n (default 20) conversations as JSON, refuses a bad
// n, and FetchHot reads it back.
func TestDebugHot(t *testing.T) {
	var asked []int
	hot := func(n int) []HotConversation {
		asked = append(asked, n)
		return []HotConversation{{Conversation: "c1", VShard: 3, PerSecond: 12.5}}
	}
	mux := http.NewServeMux()
	MountHot(hot)(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()
	got, err := FetchHot(ctx, srv.Client(), strings.TrimPrefix(srv.URL, "http://"), 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != (HotConversation{Conversation: "c1", VShard: 3, PerSecond: 12.5}) {
		t.Fatalf("got %+v", got)
	}
	resp, err := http.Get(srv.URL + "/debug/hot")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("content type %q", ct)
	}
	if len(asked) != 2 || asked[0] != 7 || asked[1] != DefaultHotN {
		t.Errorf("asked for %v, want [7 %d]", asked, DefaultHotN)
	}
	for _, bad := range []string{"0", "x", "100000"} {
		resp, err := http.Get(srv.URL + "/debug/hot?n=" + bad)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("n=%s: HTTP %d, want 400", bad, resp.StatusCode)
		}
	}
	if _, err := FetchHot(ctx, srv.Client(), srv.URL, 0); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("FetchHot of a refused n: %v", err)
	}
}

// An empty worker answers an empty list, not null.
func TestDebugHotEmpty(t *testing.T) {
	mux := http.NewServeMux()
	MountHot(HotOf(nil))(mux)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/hot?n=3", nil))
	if body := strings.TrimSpace(rec.Body.String()); body != `{"conversations":[]}` {
		t.Errorf("body %s", body)
	}
}

// HotRows merges the workers' lists busiest first, keeps one row per
// conversation and vshard, and marks the isolated conversations.
func TestHotRows(t *testing.T) {
	layout := logrecord.Layout{VShards: 64, Partitions: 8, Dedicated: 2}
	lists := [][]HotConversation{
		{{Conversation: "a", VShard: 64, PerSecond: 300}, {Conversation: "b", VShard: 5, PerSecond: 40}},
		{{Conversation: "c", VShard: 9, PerSecond: 90}, {Conversation: "b", VShard: 5, PerSecond: 45}},
		{{Conversation: "d", VShard: 1, PerSecond: 1}},
	}
	overrides := map[string]lease.Override{
		"a": {VShard: 64, Since: time.Now()},
		"c": {VShard: 9, Since: time.Now()}, // a release in progress
	}
	rows := HotRows(lists, overrides, layout, 3)
	if len(rows) != 3 {
		t.Fatalf("rows %+v", rows)
	}
	if rows[0].Conversation != "a" || !rows[0].Isolated || *rows[0].Override != 64 {
		t.Errorf("row 0 %+v, want a isolated to 64", rows[0])
	}
	if rows[1].Conversation != "c" || rows[1].Isolated || rows[1].Override == nil {
		t.Errorf("row 1 %+v, want c releasing", rows[1])
	}
	if rows[2].Conversation != "b" || rows[2].PerSecond != 45 || rows[2].Override != nil {
		t.Errorf("row 2 %+v, want b once at 45/s", rows[2])
	}
}
