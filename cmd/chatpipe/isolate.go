package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/move"
	"github.com/chatpipe/chatpipe/lease"
)

// isolateFlags are the flags of admin isolate and unisolate.
type isolateFlags struct {
	inf           infraFlags
	wait          *time.Duration
	level, format *string
}

func addIsolateFlags(fs *flagSet) isolateFlags {
	f := isolateFlags{inf: addInfraFlags(fs), wait: fs.Duration("wait", 30*time.Second, "how long to wait for the move: isolate, for its moved record to be stored (needs --database-url); unisolate, for the conversation to be home")}
	fs.check(positive("wait"))
	f.level, f.format = logFlags(fs)
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

// setup connects for the command name, whose arguments (after its flags)
// are args.
func (f isolateFlags) setup(ctx context.Context, name string, args []string) (*isolateRun, error) {
	if _, err := f.inf.setup(f.level, f.format); err != nil {
		return nil, err
	}
	if *f.inf.etcd == "" || len(args) != 1 {
		return nil, fmt.Errorf("usage: chatpipe %s --etcd … (or --endpoints …) CONVERSATION_ID", name)
	}
	cli, cfg, err := etcdConfig(ctx, *f.inf.etcd, f.inf.sec, lease.Config{})
	if err != nil {
		return nil, err
	}
	r := &isolateRun{cli: cli, cfg: cfg, cid: args[0]}
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

// newIsolateCommand makes chatpipe admin isolate, which routes a
// conversation to a dedicated vshard of its own (internal/move).
func newIsolateCommand() *command {
	fs := newFlagSet("admin isolate")
	f := addIsolateFlags(fs)
	to := fs.Int("vshard", -1, "the dedicated vshard to move it to (default: the first one no conversation is routed to)")
	return newCommand(fs, "give one conversation a dedicated vshard of its own (CONVERSATION_ID; --vshard N to choose)", func(ctx context.Context, args []string) error {
		return isolate(ctx, f, *to, args)
	})
}

// isolate runs admin isolate with args, its one conversation, and the
// dedicated vshard to (-1: the first free one).
func isolate(ctx context.Context, f isolateFlags, to int, args []string) error {
	r, err := f.setup(ctx, "admin isolate", args)
	if err != nil {
		return err
	}
	defer r.close()
	res, err := move.Isolate(ctx, r.cli, r.db, r.cfg.Layout(), r.cid, to, *f.wait)
	if res.Already {
		fmt.Printf("%s is routed to vshard %d already\n", r.cid, res.VShard)
	}
	switch {
	case err != nil:
		return err
	case r.db == nil:
		fmt.Printf("%s is routed to vshard %d (give --database-url to wait for the move)\n", r.cid, res.VShard)
	default:
		fmt.Printf("%s moved to vshard %d at seq %d (stored %v after the override)\n", r.cid, res.VShard, res.Seq, res.Took.Round(time.Millisecond))
	}
	return nil
}

// newUnisolateCommand makes chatpipe admin unisolate, which routes a
// conversation back to its hashed vshard and waits for its writer to
// release the override (internal/move).
func newUnisolateCommand() *command {
	fs := newFlagSet("admin unisolate")
	f := addIsolateFlags(fs)
	return newCommand(fs, "route an isolated conversation back to its hashed vshard, then remove its override", func(ctx context.Context, args []string) error {
		return unisolate(ctx, f, args)
	})
}

// unisolate runs admin unisolate with args, its one conversation.
func unisolate(ctx context.Context, f isolateFlags, args []string) error {
	r, err := f.setup(ctx, "admin unisolate", args)
	if err != nil {
		return err
	}
	defer r.close()
	res, err := move.Unisolate(ctx, r.cli, r.cfg.VShards, r.cid, *f.wait)
	switch {
	case err != nil:
		return err
	case res.NoOverride:
		fmt.Printf("%s has no override: it is at its hashed vshard %d\n", r.cid, res.Home)
	default:
		fmt.Printf("%s is home at vshard %d: its writer removed the override %v after it was set\n", r.cid, res.Home, res.Took.Round(time.Millisecond))
	}
	return nil
}
