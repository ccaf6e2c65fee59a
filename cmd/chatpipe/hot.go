package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/shardworker"
)

// Bounds of /debug/hot's n.
const (
	defaultHotN = 20
	maxHotN     = 1000
)

// hotAnswer is the body of GET /debug/hot.
type hotAnswer struct {
	Conversations []shardworker.HotConversation `json:"conversations"`
}

// mountHot serves GET /debug/hot?n=N on a worker's admin server: the N
// (default 20) busiest conversations hot reports, as JSON.
func mountHot(hot func(n int) []shardworker.HotConversation) func(*http.ServeMux) {
	return func(mux *http.ServeMux) {
		mux.HandleFunc("GET /debug/hot", func(w http.ResponseWriter, r *http.Request) {
			n := defaultHotN
			if q := r.URL.Query().Get("n"); q != "" {
				v, err := strconv.Atoi(q)
				if err != nil || v < 1 || v > maxHotN {
					http.Error(w, fmt.Sprintf("n must be a number from 1 to %d", maxHotN), http.StatusBadRequest)
					return
				}
				n = v
			}
			out := hotAnswer{Conversations: hot(n)}
			if out.Conversations == nil {
				out.Conversations = []shardworker.HotConversation{}
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(out)
		})
	}
}

// hotOfWorkers merges the busiest conversations of several workers (the
// in-process workers of chatpipe dev).
func hotOfWorkers(ws []*shardworker.Worker) func(n int) []shardworker.HotConversation {
	return func(n int) []shardworker.HotConversation {
		var all []shardworker.HotConversation
		for _, w := range ws {
			all = append(all, w.Hot(n)...)
		}
		shardworker.SortHot(all)
		if len(all) > n {
			all = all[:n]
		}
		return all
	}
}

// hotRow is one line of `chatpipe admin hot`.
type hotRow struct {
	shardworker.HotConversation
	// Isolated: the conversation has an override naming a dedicated vshard.
	Isolated bool `json:"isolated"`
	// Override is the vshard its override names, if it has one (one naming
	// its hashed vshard is a release in progress).
	Override *int `json:"override_vshard,omitempty"`
}

// hotRows merges the workers' lists into the n busiest rows, marking the
// conversations with an override. A conversation reported twice for the
// same vshard (a handoff between two reads) keeps its higher rate.
func hotRows(lists [][]shardworker.HotConversation, overrides map[string]lease.Override, layout logrecord.Layout, n int) []hotRow {
	type key struct {
		conv string
		v    int
	}
	best := map[key]shardworker.HotConversation{}
	for _, l := range lists {
		for _, h := range l {
			k := key{h.Conversation, h.VShard}
			if have, ok := best[k]; !ok || h.PerSecond > have.PerSecond {
				best[k] = h
			}
		}
	}
	merged := make([]shardworker.HotConversation, 0, len(best))
	for _, h := range best {
		merged = append(merged, h)
	}
	shardworker.SortHot(merged)
	if len(merged) > n {
		merged = merged[:n]
	}
	out := make([]hotRow, len(merged))
	for i, h := range merged {
		out[i] = hotRow{HotConversation: h}
		if o, ok := overrides[h.Conversation]; ok {
			v := o.VShard
			out[i].Override = &v
			out[i].Isolated = layout.IsDedicated(v)
		}
	}
	return out
}

// fetchHot asks the admin server at addr for its n busiest conversations.
func fetchHot(ctx context.Context, hc *http.Client, addr string, n int) ([]shardworker.HotConversation, error) {
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

// hotSources are the admin addresses to ask: every live worker's, and,
// for workers that advertise none (the in-process workers of chatpipe
// dev), the dev process's admin address from --endpoints.
func hotSources(ctx context.Context, cli *clientv3.Client, endpoints string) ([]string, error) {
	resp, err := cli.Get(ctx, lease.DefaultPrefix+"workers/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read workers: %w", err)
	}
	seen := map[string]bool{}
	var addrs []string
	silent := 0
	for _, kv := range resp.Kvs {
		var info lease.WorkerInfo
		if json.Unmarshal(kv.Value, &info) != nil {
			continue
		}
		if info.Admin == "" {
			silent++
			continue
		}
		if !seen[info.Admin] {
			seen[info.Admin] = true
			addrs = append(addrs, info.Admin)
		}
	}
	if silent > 0 && endpoints != "" {
		ep, err := readEndpoints(endpoints)
		if err != nil {
			return nil, err
		}
		if ep.Admin != "" && !seen[ep.Admin] {
			addrs = append(addrs, ep.Admin)
		}
	}
	sort.Strings(addrs)
	return addrs, nil
}

// adminHot prints the busiest conversations of the deployment, from the
// workers' own counters.
func adminHot(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("admin hot", flag.ContinueOnError)
	inf := addInfraFlags(fs)
	top := fs.Int("top", defaultHotN, "show this many conversations")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for each worker")
	checkFlags(fs, atLeast("top", 1), positive("timeout"))
	level, format := logFlags(fs)
	if _, err := inf.setup(fs, args, level, format); err != nil {
		return err
	}
	if *inf.etcd == "" {
		return errors.New("need --endpoints or --etcd")
	}
	if *top > maxHotN {
		return fmt.Errorf("--top: at most %d", maxHotN)
	}
	cli, cfg, err := etcdConfig(ctx, *inf.etcd, inf.sec, lease.Config{})
	if err != nil {
		return err
	}
	defer cli.Close()
	addrs, err := hotSources(ctx, cli, *inf.endpoints)
	if err != nil {
		return err
	}
	if len(addrs) == 0 {
		return errors.New("no live worker advertises an admin address (start workers with --admin)")
	}
	overrides, err := lease.Overrides(ctx, cli, lease.DefaultPrefix)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: *timeout}
	lists := make([][]shardworker.HotConversation, len(addrs))
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() { lists[i], errs[i] = fetchHot(ctx, hc, a, *top) })
	}
	wg.Wait()
	var unreachable []string
	for i, err := range errs {
		if err != nil {
			fmt.Fprintln(os.Stderr, "warning:", err)
			unreachable = append(unreachable, addrs[i])
		}
	}
	if len(unreachable) == len(addrs) {
		return fmt.Errorf("no worker answered (%d asked)", len(addrs))
	}
	rows := hotRows(lists, overrides, cfg.Layout(), *top)
	if *asJSON {
		out := struct {
			Conversations []hotRow `json:"conversations"`
			Unreachable   []string `json:"unreachable,omitempty"`
		}{Conversations: rows, Unreachable: unreachable}
		if out.Conversations == nil {
			out.Conversations = []hotRow{}
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return printHot(os.Stdout, rows)
}

// printHot writes rows as admin hot's table.
func printHot(w io.Writer, rows []hotRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONVERSATION\tVSHARD\tMSG/S\tISOLATED")
	for _, r := range rows {
		iso := "no"
		switch {
		case r.Isolated:
			iso = fmt.Sprintf("yes (vshard %d)", *r.Override)
		case r.Override != nil:
			iso = "releasing"
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%s\n", r.Conversation, r.VShard, r.PerSecond, iso)
	}
	return tw.Flush()
}
