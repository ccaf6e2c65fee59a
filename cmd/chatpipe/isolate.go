package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
)

// isolateFlags are the flags of admin isolate and unisolate.
type isolateFlags struct {
	inf  infraFlags
	wait *time.Duration
}

func addIsolateFlags(fs *flag.FlagSet) isolateFlags {
	f := isolateFlags{inf: addInfraFlags(fs), wait: fs.Duration("wait", 30*time.Second, "how long to wait for the move: isolate, for its moved record to be stored (needs --database-url); unisolate, for the conversation to be home")}
	checkFlags(fs, positive("wait"))
	return f
}

// isolateRun is what admin isolate and unisolate work with: etcd, the
// deployment's config, Postgres (nil without --database-url) and the one
// conversation argument.
type isolateRun struct {
	cli *clientv3.Client
	cfg lease.Config
	db  *pgxpool.Pool
	cid string
}

func (r *isolateRun) close() {
	r.cli.Close()
	if r.db != nil {
		r.db.Close()
	}
}

// setup parses the flags and connects.
func (f isolateFlags) setup(ctx context.Context, fs *flag.FlagSet, args []string) (*isolateRun, error) {
	level, format := logFlags(fs)
	if _, err := f.inf.setup(fs, args, level, format); err != nil {
		return nil, err
	}
	if *f.inf.etcd == "" || fs.NArg() != 1 {
		return nil, fmt.Errorf("usage: chatpipe %s --etcd … (or --endpoints …) CONVERSATION_ID", fs.Name())
	}
	cli, cfg, err := etcdConfig(ctx, *f.inf.etcd, f.inf.sec, lease.Config{})
	if err != nil {
		return nil, err
	}
	r := &isolateRun{cli: cli, cfg: cfg, cid: fs.Arg(0)}
	if cfg.Dedicated == 0 {
		r.close()
		return nil, errors.New("this deployment has no dedicated vshards (chatpipe init --dedicated N when it is made)")
	}
	if *f.inf.dbURL != "" {
		if r.db, err = openDB(ctx, *f.inf.dbURL); err != nil {
			r.close()
			return nil, err
		}
	}
	return r, nil
}

// adminIsolate routes a conversation to a dedicated vshard of its own: the
// writer that has it commits a moved record, and the dedicated vshard's
// writer continues its seq once that record is stored.
func adminIsolate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("admin isolate", flag.ContinueOnError)
	f := addIsolateFlags(fs)
	to := fs.Int("vshard", -1, "the dedicated vshard to move it to (default: the first one no conversation is routed to)")
	r, err := f.setup(ctx, fs, args)
	if err != nil {
		return err
	}
	defer r.close()
	cli, db, cid := r.cli, r.db, r.cid
	l := r.cfg.Layout()
	routes, err := lease.Overrides(ctx, cli, lease.DefaultPrefix)
	if err != nil {
		return err
	}
	cur, rev, err := lease.OverrideRev(ctx, cli, lease.DefaultPrefix, cid)
	if err != nil {
		return err
	}
	target, err := pickDedicated(l, routes, cid, *to)
	if err != nil {
		return err
	}
	if rev != 0 && cur.VShard == target {
		fmt.Printf("%s is routed to vshard %d already\n", cid, target)
	} else {
		ok, err := lease.SetOverride(ctx, cli, lease.DefaultPrefix, cid, target, rev, time.Now())
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s's override changed meanwhile; run the command again", cid)
		}
	}
	return waitMoved(ctx, db, cid, target, *f.wait)
}

// pickDedicated is the dedicated vshard to isolate cid to: want if given
// (it must be dedicated), else the first one no other conversation is
// routed to.
func pickDedicated(l logrecord.Layout, routes map[string]lease.Override, cid string, want int) (int, error) {
	if want >= 0 {
		if !l.IsDedicated(want) {
			return 0, fmt.Errorf("vshard %d is not a dedicated vshard (they are %d–%d)", want, l.VShards, l.AllVShards()-1)
		}
		return want, nil
	}
	if o, ok := routes[cid]; ok && l.IsDedicated(o.VShard) {
		return o.VShard, nil
	}
	used := map[int]bool{}
	for c, o := range routes {
		if c != cid {
			used[o.VShard] = true
		}
	}
	for v := l.VShards; v < l.AllVShards(); v++ {
		if !used[v] {
			return v, nil
		}
	}
	return 0, fmt.Errorf("every dedicated vshard (%d–%d) has a conversation; release one (admin unisolate) or name one with --vshard", l.VShards, l.AllVShards()-1)
}

// adminUnisolate routes a conversation back to its hashed vshard: the
// override names the hashed vshard, the writer that has the conversation
// moves it there, and that vshard's writer deletes the override once its
// state holds the conversation (docs/architecture.md rule 22). It waits
// for the delete.
func adminUnisolate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("admin unisolate", flag.ContinueOnError)
	f := addIsolateFlags(fs)
	r, err := f.setup(ctx, fs, args)
	if err != nil {
		return err
	}
	defer r.close()
	cli, cid := r.cli, r.cid
	home := logrecord.VShard(cid, r.cfg.VShards)
	cur, rev, err := lease.OverrideRev(ctx, cli, lease.DefaultPrefix, cid)
	if err != nil {
		return err
	}
	if rev == 0 {
		// Already released (a run that timed out finishes by itself), or
		// never isolated: it is written at its hashed vshard either way.
		fmt.Printf("%s has no override: it is at its hashed vshard %d\n", cid, home)
		return nil
	}
	if cur.VShard != home {
		ok, err := lease.SetOverride(ctx, cli, lease.DefaultPrefix, cid, home, rev, time.Now())
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s's override changed meanwhile; run the command again", cid)
		}
		if _, rev, err = lease.OverrideRev(ctx, cli, lease.DefaultPrefix, cid); err != nil {
			return err
		}
	}
	return waitReleased(ctx, cli, cid, home, rev, *f.wait)
}

// waitReleased waits until conversation cid's override, naming its hashed
// vshard home at mod revision rev, is deleted: by the writer of home, once
// its state holds the conversation.
func waitReleased(ctx context.Context, cli *clientv3.Client, cid string, home int, rev int64, wait time.Duration) error {
	start := time.Now()
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), wait)
	defer cancel()
	for resp := range cli.Watch(wctx, lease.RouteKey(lease.DefaultPrefix, cid), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("watch %s's override: %w", cid, err)
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				fmt.Printf("%s is home at vshard %d: its writer removed the override %v after it was set\n", cid, home, time.Since(start).Round(time.Millisecond))
				return nil
			}
			return fmt.Errorf("%s's override changed meanwhile (%s); it was not released", cid, ev.Kv.Value)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%s is routed to its hashed vshard %d, but is not back there after %v: the override stays, the writers keep moving it home, and vshard %d's writer removes the override once it holds the conversation (is a worker running? is persist? the move home waits for persist to store the moved record)", cid, home, wait, home)
}

// locationSQL is where Postgres says a conversation is written: the
// target of its last moved event (NULL: never moved).
const locationSQL = `SELECT to_vshard, seq, created_at FROM events WHERE conversation_id = $1 AND kind = 'moved' ORDER BY seq DESC LIMIT 1`

// waitMoved waits until Postgres says conversation cid is at vshard to:
// its last moved record names it. Without db it only says what it did.
func waitMoved(ctx context.Context, db *pgxpool.Pool, cid string, to int, wait time.Duration) error {
	if db == nil {
		fmt.Printf("%s is routed to vshard %d (give --database-url to wait for the move)\n", cid, to)
		return nil
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		var at *int32
		var seq int64
		var when time.Time
		err := db.QueryRow(ctx, locationSQL, cid).Scan(&at, &seq, &when)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil && ctx.Err() == nil:
			return fmt.Errorf("read %s's location: %w", cid, err)
		case err == nil && at != nil && int(*at) == to:
			fmt.Printf("%s moved to vshard %d at seq %d (stored %v after the override)\n", cid, to, seq, time.Since(start).Round(time.Millisecond))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is routed to vshard %d, but its moved record was not stored within %v (is its writer running? is persist?)", cid, to, wait)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
