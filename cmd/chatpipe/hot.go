package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/shardworker"
)

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

// newHotCommand makes chatpipe admin hot, which prints the busiest
// conversations of the deployment, from the workers' own counters.
func newHotCommand() *command {
	fs := newFlagSet("admin hot")
	inf := addInfraFlags(fs)
	top := fs.Int("top", shardworker.DefaultHotN, "show this many conversations")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for each worker")
	fs.check(atLeast("top", 1), positive("timeout"))
	level, format := logFlags(fs)
	return newCommand(fs, "the busiest conversations, from the workers' own counters, and whether each is isolated", func(ctx context.Context, _ []string) error {
		if _, err := inf.setup(level, format); err != nil {
			return err
		}
		if *inf.etcd == "" {
			return errors.New("need --endpoints or --etcd")
		}
		if *top > shardworker.MaxHotN {
			return fmt.Errorf("--top: at most %d", shardworker.MaxHotN)
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
			wg.Go(func() { lists[i], errs[i] = shardworker.FetchHot(ctx, hc, a, *top) })
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
		rows := shardworker.HotRows(lists, overrides, cfg.Layout(), *top)
		if *asJSON {
			out := struct {
				Conversations []shardworker.HotRow `json:"conversations"`
				Unreachable   []string             `json:"unreachable,omitempty"`
			}{Conversations: rows, Unreachable: unreachable}
			if out.Conversations == nil {
				out.Conversations = []shardworker.HotRow{}
			}
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		}
		return printHot(os.Stdout, rows)
	})
}

// printHot writes rows as admin hot's table.
func printHot(w io.Writer, rows []shardworker.HotRow) error {
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
