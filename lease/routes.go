package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Override is the value of routes/<conversation_id>: the conversation's
// commands go to VShard instead of its hashed vshard. An override that
// names the hashed vshard is a release in progress: the writers that may
// hold the conversation move it home, and `chatpipe admin unisolate`
// deletes the key once it is there.
type Override struct {
	VShard int       `json:"vshard"`
	Since  time.Time `json:"since"`
	// Rev is the key's mod revision as read (not stored in the value): a
	// compare-and-swap on the override names it.
	Rev int64 `json:"-"`
}

func routesPrefix(prefix string) string { return prefix + "routes/" }

// RouteKey is the etcd key of conversation cid's override.
func RouteKey(prefix, cid string) string { return routesPrefix(prefix) + cid }

// Overrides reads every override.
func Overrides(ctx context.Context, cli *clientv3.Client, prefix string) (map[string]Override, error) {
	resp, err := cli.Get(ctx, routesPrefix(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("lease: read overrides: %w", err)
	}
	out := make(map[string]Override, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var o Override
		if err := json.Unmarshal(kv.Value, &o); err != nil {
			return nil, fmt.Errorf("lease: decode override %s: %w", kv.Key, err)
		}
		o.Rev = kv.ModRevision
		out[strings.TrimPrefix(string(kv.Key), routesPrefix(prefix))] = o
	}
	return out, nil
}

// SetOverride routes conversation cid to vshard v. With prevRev ≥ 0 it
// succeeds only if the key is still at that mod revision (0: absent), so
// two operators cannot both pick the same free vshard unknowingly; it
// reports whether it wrote.
func SetOverride(ctx context.Context, cli *clientv3.Client, prefix, cid string, v int, prevRev int64, now time.Time) (bool, error) {
	val, err := json.Marshal(Override{VShard: v, Since: now.UTC()})
	if err != nil {
		return false, fmt.Errorf("lease: encode override: %w", err)
	}
	key := RouteKey(prefix, cid)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", prevRev)).Then(clientv3.OpPut(key, string(val))).Commit()
	if err != nil {
		return false, fmt.Errorf("lease: write override of %s: %w", cid, err)
	}
	return resp.Succeeded, nil
}

// DeleteOverride removes conversation cid's override if it is still at
// mod revision rev; it reports whether it did.
func DeleteOverride(ctx context.Context, cli *clientv3.Client, prefix, cid string, rev int64) (bool, error) {
	key := RouteKey(prefix, cid)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return false, fmt.Errorf("lease: delete override of %s: %w", cid, err)
	}
	return resp.Succeeded, nil
}

// ReleaseOverride deletes conversation cid's override if it is still at
// mod revision rev and the owner row of vshard v is still at mod revision
// ownerRev; it reports whether it did. The writer of the conversation's
// hashed vshard calls it once its state holds the conversation and the
// override names that vshard (a release): only the writer that holds a
// conversation moves it, and one that has read the override naming its
// own vshard moves it nowhere, so no move decided on an older route can
// follow. The owner row's revision keeps a writer that lost the vshard
// (its row was written since) from deleting it for the new owner, whose
// view may not have reached the override yet.
func ReleaseOverride(ctx context.Context, cli *clientv3.Client, prefix, cid string, rev int64, v int, ownerRev int64) (bool, error) {
	key := RouteKey(prefix, cid)
	resp, err := cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(key), "=", rev),
		clientv3.Compare(clientv3.ModRevision(shardKey(prefix, v)), "=", ownerRev),
	).Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return false, fmt.Errorf("lease: release override of %s: %w", cid, err)
	}
	return resp.Succeeded, nil
}

// OverrideRev reads conversation cid's override and its mod revision (0:
// none).
func OverrideRev(ctx context.Context, cli *clientv3.Client, prefix, cid string) (Override, int64, error) {
	resp, err := cli.Get(ctx, RouteKey(prefix, cid))
	if err != nil {
		return Override{}, 0, fmt.Errorf("lease: read override of %s: %w", cid, err)
	}
	if len(resp.Kvs) == 0 {
		return Override{}, 0, nil
	}
	var o Override
	if err := json.Unmarshal(resp.Kvs[0].Value, &o); err != nil {
		return Override{}, 0, fmt.Errorf("lease: decode override of %s: %w", cid, err)
	}
	o.Rev = resp.Kvs[0].ModRevision
	return o, o.Rev, nil
}
