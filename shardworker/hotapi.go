package shardworker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
)

// The busiest conversations over HTTP: a worker's admin server answers
// GET /debug/hot, and `chatpipe admin hot` asks every worker and merges
// their answers with the overrides into one list (HotRows).

// Bounds of /debug/hot's n.
const (
	DefaultHotN = 20
	MaxHotN     = 1000
)

// hotAnswer is the body of GET /debug/hot.
type hotAnswer struct {
	Conversations []HotConversation `json:"conversations"`
}

// MountHot returns what serves GET /debug/hot?n=N on an admin server: the
// N (default 20) busiest conversations hot reports, as JSON.
func MountHot(hot func(n int) []HotConversation) func(*http.ServeMux) {
	return func(mux *http.ServeMux) {
		mux.HandleFunc("GET /debug/hot", func(w http.ResponseWriter, r *http.Request) {
			n := DefaultHotN
			if q := r.URL.Query().Get("n"); q != "" {
				v, err := strconv.Atoi(q)
				if err != nil || v < 1 || v > MaxHotN {
					http.Error(w, fmt.Sprintf("n must be a number from 1 to %d", MaxHotN), http.StatusBadRequest)
					return
				}
				n = v
			}
			out := hotAnswer{Conversations: hot(n)}
			if out.Conversations == nil {
				out.Conversations = []HotConversation{}
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(out)
		})
	}
}

// HotOf merges the busiest conversations of several workers (the
// in-process workers of chatpipe dev).
func HotOf(ws []*Worker) func(n int) []HotConversation {
	return func(n int) []HotConversation {
		var all []HotConversation
		for _, w := range ws {
			all = append(all, w.Hot(n)...)
		}
		SortHot(all)
		if len(all) > n {
			all = all[:n]
		}
		return all
	}
}

// FetchHot asks the admin server at addr for its n busiest conversations.
func FetchHot(ctx context.Context, hc *http.Client, addr string, n int) ([]HotConversation, error) {
	base := addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/debug/hot?n="+strconv.Itoa(n), nil)
	if err != nil {
		return nil, fmt.Errorf("hot conversations of %s: %w", addr, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("hot conversations of %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("hot conversations of %s: HTTP %d: %s", addr, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	var a hotAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&a); err != nil {
		return nil, fmt.Errorf("hot conversations of %s: decode: %w", addr, err)
	}
	return a.Conversations, nil
}

// HotRow is one line of `chatpipe admin hot`.
type HotRow struct {
	HotConversation
	// Isolated: the conversation has an override naming a dedicated vshard.
	Isolated bool `json:"isolated"`
	// Override is the vshard its override names, if it has one (one naming
	// its hashed vshard is a release in progress).
	Override *int `json:"override_vshard,omitempty"`
}

// HotRows merges the workers' lists into the n busiest rows, marking the
// conversations with an override. A conversation reported twice for the
// same vshard (a handoff between two reads) keeps its higher rate.
func HotRows(lists [][]HotConversation, overrides map[string]lease.Override, layout logrecord.Layout, n int) []HotRow {
	type key struct {
		conv string
		v    int
	}
	best := map[key]HotConversation{}
	for _, l := range lists {
		for _, h := range l {
			k := key{h.Conversation, h.VShard}
			if have, ok := best[k]; !ok || h.PerSecond > have.PerSecond {
				best[k] = h
			}
		}
	}
	merged := make([]HotConversation, 0, len(best))
	for _, h := range best {
		merged = append(merged, h)
	}
	SortHot(merged)
	if len(merged) > n {
		merged = merged[:n]
	}
	out := make([]HotRow, len(merged))
	for i, h := range merged {
		out[i] = HotRow{HotConversation: h}
		if o, ok := overrides[h.Conversation]; ok {
			v := o.VShard
			out[i].Override = &v
			out[i].Isolated = layout.IsDedicated(v)
		}
	}
	return out
}
