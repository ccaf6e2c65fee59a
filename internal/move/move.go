// Package move is the operator's side of a live move of one conversation
// (docs/architecture.md, rules 20–22): `chatpipe admin isolate` routes it
// to a dedicated vshard of its own, `admin unisolate` routes it back to
// its hashed vshard. The writers do the move itself — the one that holds
// the conversation commits a moved record, the one it moves to continues
// its seq once that record is stored — so what is here is the choice of
// a vshard, the compare-and-swap of the override in etcd, and the wait
// for the move to land: for isolate, until Postgres stores the moved
// record; for unisolate, until the hashed vshard's writer deletes the
// override, which it does once its state holds the conversation.
package move

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
)

// ErrChanged is returned when conversation's override changed between
// the read and the compare-and-swap: another operator moved it meanwhile.
var ErrChanged = errors.New("the override changed meanwhile; run the command again")

// Isolated is what Isolate did.
type Isolated struct {
	// VShard is the dedicated vshard the conversation is routed to.
	VShard int
	// Already is true when it was routed there before.
	Already bool
	// Seq is the seq of the moved record Postgres stored and Took the
	// time from the override to it (zero without a database to wait on).
	Seq  int64
	Took time.Duration
}

// Isolate routes conversation cid to a dedicated vshard: want if ≥ 0,
// else as PickDedicated picks. With db it then waits up to wait for the
// moved record naming that vshard to be stored.
func Isolate(ctx context.Context, cli *clientv3.Client, db *pgxpool.Pool, l logrecord.Layout, cid string, want int, wait time.Duration) (Isolated, error) {
	routes, err := lease.Overrides(ctx, cli, lease.DefaultPrefix)
	if err != nil {
		return Isolated{}, err
	}
	cur := routes[cid] // its Rev: 0 when cid has no override
	rev := cur.Rev
	target, err := PickDedicated(l, routes, cid, want)
	if err != nil {
		return Isolated{}, err
	}
	res := Isolated{VShard: target, Already: rev != 0 && cur.VShard == target}
	if !res.Already {
		ok, err := lease.SetOverride(ctx, cli, lease.DefaultPrefix, cid, target, rev, time.Now())
		if err != nil {
			return res, err
		}
		if !ok {
			return res, fmt.Errorf("%s: %w", cid, ErrChanged)
		}
	}
	if db == nil {
		return res, nil
	}
	res.Seq, res.Took, err = WaitMoved(ctx, db, cid, target, wait)
	return res, err
}

// PickDedicated is the dedicated vshard to isolate cid to: want if given
// (it must be dedicated), else the one cid is routed to already, else the
// first one no other conversation is routed to.
func PickDedicated(l logrecord.Layout, routes map[string]lease.Override, cid string, want int) (int, error) {
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

// Released is what Unisolate did.
type Released struct {
	// Home is the conversation's hashed vshard.
	Home int
	// NoOverride is true when there was none to release: never isolated,
	// or released already.
	NoOverride bool
	// Took is the time from the override naming home to its delete.
	Took time.Duration
}

// Unisolate routes conversation cid back to its hashed vshard of vshards
// and waits up to wait for that vshard's writer to delete the override,
// which it does once its state holds the conversation.
func Unisolate(ctx context.Context, cli *clientv3.Client, vshards int, cid string, wait time.Duration) (Released, error) {
	res := Released{Home: logrecord.VShard(cid, vshards)}
	cur, rev, err := lease.OverrideRev(ctx, cli, lease.DefaultPrefix, cid)
	if err != nil {
		return res, err
	}
	if rev == 0 {
		// Already released (a run that timed out finishes by itself), or
		// never isolated: it is written at its hashed vshard either way.
		res.NoOverride = true
		return res, nil
	}
	if cur.VShard != res.Home {
		ok, err := lease.SetOverride(ctx, cli, lease.DefaultPrefix, cid, res.Home, rev, time.Now())
		if err != nil {
			return res, err
		}
		if !ok {
			return res, fmt.Errorf("%s: %w", cid, ErrChanged)
		}
		if _, rev, err = lease.OverrideRev(ctx, cli, lease.DefaultPrefix, cid); err != nil {
			return res, err
		}
	}
	res.Took, err = WaitReleased(ctx, cli, cid, res.Home, rev, wait)
	return res, err
}

// WaitReleased waits up to wait until conversation cid's override, naming
// its hashed vshard home at mod revision rev, is deleted: by the writer of
// home, once its state holds the conversation. It returns how long that
// took.
func WaitReleased(ctx context.Context, cli *clientv3.Client, cid string, home int, rev int64, wait time.Duration) (time.Duration, error) {
	start := time.Now()
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), wait)
	defer cancel()
	for resp := range cli.Watch(wctx, lease.RouteKey(lease.DefaultPrefix, cid), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			return 0, fmt.Errorf("watch %s's override: %w", cid, err)
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return time.Since(start), nil
			}
			return 0, fmt.Errorf("%s's override changed meanwhile (%s); it was not released", cid, ev.Kv.Value)
		}
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	return 0, fmt.Errorf("%s is routed to its hashed vshard %d, but is not back there after %v: the override stays, the writers keep moving it home, and vshard %d's writer removes the override once it holds the conversation (is a worker running? is persist? the move home waits for persist to store the moved record)", cid, home, wait, home)
}

// locationSQL is where Postgres says a conversation is written: the
// target of its last moved event (NULL: never moved).
const locationSQL = `SELECT to_vshard, seq, created_at FROM events WHERE conversation_id = $1 AND kind = 'moved' ORDER BY seq DESC LIMIT 1`

// WaitMoved waits up to wait until Postgres says conversation cid is at
// vshard to: its last stored moved record names it. It returns that
// record's seq and how long the wait took.
func WaitMoved(ctx context.Context, db *pgxpool.Pool, cid string, to int, wait time.Duration) (int64, time.Duration, error) {
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
			return 0, 0, fmt.Errorf("read %s's location: %w", cid, err)
		case err == nil && at != nil && int(*at) == to:
			return seq, time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("%s is routed to vshard %d, but its moved record was not stored within %v (is its writer running? is persist?)", cid, to, wait)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
