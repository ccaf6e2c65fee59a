package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/ownership"
	"github.com/chatpipe/chatpipe/logrecord"
)

// DefaultPrefix is the default etcd key prefix.
const DefaultPrefix = "/chatpipe/"

// Config is the deployment's fixed shape, written once to <prefix>config.
type Config struct {
	VShards    int    `json:"vshards"`
	Partitions int    `json:"partitions"`
	Topic      string `json:"topic"`
	// Dedicated is the number of dedicated vshards beyond the hashed ones,
	// each with a partition of its own after the hashed partitions
	// (logrecord.Layout).
	Dedicated int `json:"dedicated,omitempty"`
}

// Layout is the deployment's shape as logrecord maps it.
func (c Config) Layout() logrecord.Layout {
	return logrecord.Layout{VShards: c.VShards, Partitions: c.Partitions, Dedicated: c.Dedicated}
}

// ErrNoConfig is returned by EnsureConfig when etcd holds no config and the
// caller did not give a complete one to write (run `chatpipe init`).
var ErrNoConfig = errors.New("lease: no deployment config in etcd yet (run 'chatpipe init' or 'chatpipe dev' first)")

// ErrConfigMismatch is returned by EnsureConfig when etcd holds another config.
var ErrConfigMismatch = errors.New("lease: config in etcd differs")

// EnsureConfig writes want to etcd if no config is there yet and returns the
// config in force. A process whose want differs from etcd's refuses to start:
// it gets ErrConfigMismatch. A want with zero fields adopts etcd's values.
func EnsureConfig(ctx context.Context, cli *clientv3.Client, prefix string, want Config) (Config, error) {
	key := prefix + "config"
	complete := want.VShards > 0 && want.Partitions > 0 && want.Topic != ""
	val, err := json.Marshal(want)
	if err != nil {
		return Config{}, fmt.Errorf("lease: encode config: %w", err)
	}
	put := clientv3.OpPut(key, string(val))
	if !complete {
		put = clientv3.OpGet(key) // never write a partial config
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(put).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return Config{}, fmt.Errorf("lease: write config: %w", err)
	}
	if resp.Succeeded {
		if !complete {
			return Config{}, ErrNoConfig
		}
		return want, nil
	}
	var have Config
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Config{}, errors.New("lease: config vanished")
	}
	if err := json.Unmarshal(kvs[0].Value, &have); err != nil {
		return Config{}, fmt.Errorf("lease: decode config: %w", err)
	}
	if (want.VShards != 0 && want.VShards != have.VShards) ||
		(want.Partitions != 0 && want.Partitions != have.Partitions) ||
		(want.Topic != "" && want.Topic != have.Topic) ||
		(want.Dedicated != 0 && want.Dedicated != have.Dedicated) {
		return have, fmt.Errorf("%w: etcd has %+v, this process was started with %+v", ErrConfigMismatch, have, want)
	}
	return have, nil
}

// The ownership types live in package ownership, which imports no etcd
// client, so the planner and the simulation can use them; these names keep
// them where the etcd side speaks of them.
type (
	// WorkerInfo is the value of workers/<id>, attached to the worker's lease.
	WorkerInfo = ownership.WorkerInfo
	// Owner is the value of shards/<n>.
	Owner = ownership.Owner
	// Row is an owner row with the revision a compare-and-swap must match.
	Row = ownership.Row
	// View is a snapshot of the owner rows and the live workers.
	View = ownership.View
	// Move is one ownership change (ownership.Plan).
	Move = ownership.Move
)

func workersPrefix(prefix string) string { return prefix + "workers/" }
func shardsPrefix(prefix string) string  { return prefix + "shards/" }
func shardKey(prefix string, v int) string {
	return shardsPrefix(prefix) + strconv.Itoa(v)
}

func parseShardKey(prefix, key string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(key, shardsPrefix(prefix)))
	return n, err == nil && n >= 0
}

// ReadOwner reads shards/<v> with a linearizable read. ok is false when the
// row does not exist.
func ReadOwner(ctx context.Context, cli *clientv3.Client, prefix string, v int) (o Owner, ok bool, err error) {
	resp, err := cli.Get(ctx, shardKey(prefix, v))
	if err != nil {
		return Owner{}, false, fmt.Errorf("lease: read owner of vshard %d: %w", v, err)
	}
	if len(resp.Kvs) == 0 {
		return Owner{}, false, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &o); err != nil {
		return Owner{}, false, fmt.Errorf("lease: decode owner of vshard %d: %w", v, err)
	}
	return o, true, nil
}
