package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Watcher keeps a View of <prefix>shards/ and <prefix>workers/, and the
// overrides of <prefix>routes/, current by watching etcd.
type Watcher struct {
	cli    *clientv3.Client
	prefix string
	log    *slog.Logger

	mu      sync.Mutex
	rev     int64 // etcd's revision the view is at
	view    View
	routes  map[string]Override
	changed chan struct{}
	// routed is a copy of routes made at each change, read without the
	// lock on every command's route (nil: no overrides).
	routed atomic.Pointer[map[string]Override]
}

// Watch loads the current rows and keeps them current until ctx ends.
func Watch(ctx context.Context, cli *clientv3.Client, prefix string, log *slog.Logger) (*Watcher, error) {
	if log == nil {
		log = slog.Default()
	}
	w := &Watcher{cli: cli, prefix: prefix, log: log, changed: make(chan struct{})}
	rev, err := w.load(ctx)
	if err != nil {
		return nil, err
	}
	go w.run(ctx, rev)
	return w, nil
}

// Static returns a Watcher of a fixed view, watching nothing: for tests of
// components that route by the owner rows.
func Static(v View) *Watcher {
	return &Watcher{log: slog.Default(), view: v, changed: make(chan struct{})}
}

// Snapshot returns a copy of the current view.
func (w *Watcher) Snapshot() View {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := View{Shards: make(map[int]Row, len(w.view.Shards)), Workers: make(map[string]WorkerInfo, len(w.view.Workers))}
	for k, r := range w.view.Shards {
		v.Shards[k] = r
	}
	for k, i := range w.view.Workers {
		v.Workers[k] = i
	}
	return v
}

// Route returns vshard v's live owner and its address.
func (w *Watcher) Route(v int) (Row, WorkerInfo, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.view.Live(v)
}

// Override returns where conversation cid's commands are routed instead
// of its hashed vshard, if anywhere.
func (w *Watcher) Override(cid string) (int, bool) {
	m := w.routed.Load()
	if m == nil {
		return 0, false
	}
	o, ok := (*m)[cid]
	return o.VShard, ok
}

// Overrides returns a copy of every override.
func (w *Watcher) Overrides() map[string]Override {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]Override, len(w.routes))
	for k, o := range w.routes {
		out[k] = o
	}
	return out
}

// StaticOverrides returns a Watcher of a fixed view with overrides, for
// tests.
func StaticOverrides(v View, routes map[string]Override) *Watcher {
	w := Static(v)
	w.routes = routes
	w.notifyLocked()
	return w
}

// Changed returns a channel closed at the next change of the view.
func (w *Watcher) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// WaitFor waits until the view includes etcd's revision rev, e.g. the
// caller's own writes, or ctx ends.
func (w *Watcher) WaitFor(ctx context.Context, rev int64) error {
	for {
		w.mu.Lock()
		cur, ch := w.rev, w.changed
		w.mu.Unlock()
		if cur >= rev {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("lease: view at revision %d, waiting for %d: %w", cur, rev, ctx.Err())
		}
	}
}

func (w *Watcher) load(ctx context.Context) (int64, error) {
	resp, err := w.cli.Get(ctx, w.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("lease: load ownership: %w", err)
	}
	v := View{Shards: map[int]Row{}, Workers: map[string]WorkerInfo{}}
	w.mu.Lock()
	w.routes = map[string]Override{}
	for _, kv := range resp.Kvs {
		w.applyLocked(&v, string(kv.Key), kv.Value, kv.ModRevision, false)
	}
	w.view = v
	w.rev = resp.Header.Revision
	w.notifyLocked()
	w.mu.Unlock()
	return resp.Header.Revision, nil
}

func (w *Watcher) run(ctx context.Context, rev int64) {
	for ctx.Err() == nil {
		wch := w.cli.Watch(clientv3.WithRequireLeader(ctx), w.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wch {
			if err := resp.Err(); err != nil {
				w.log.Warn("ownership watch interrupted", "err", err)
				break
			}
			w.mu.Lock()
			for _, ev := range resp.Events {
				w.applyLocked(&w.view, string(ev.Kv.Key), ev.Kv.Value, ev.Kv.ModRevision, ev.Type == clientv3.EventTypeDelete)
			}
			w.rev = max(w.rev, resp.Header.Revision)
			w.notifyLocked()
			w.mu.Unlock()
			rev = resp.Header.Revision
		}
		if ctx.Err() != nil {
			return
		}
		// Reload from scratch: the watch may have missed events (compaction,
		// lost leader).
		for ctx.Err() == nil {
			r, err := w.load(ctx)
			if err == nil {
				rev = r
				break
			}
			w.log.Warn("reloading ownership", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (w *Watcher) applyLocked(v *View, key string, val []byte, modRev int64, deleted bool) {
	switch {
	case strings.HasPrefix(key, shardsPrefix(w.prefix)):
		n, ok := parseShardKey(w.prefix, key)
		if !ok {
			return
		}
		if deleted {
			delete(v.Shards, n)
			return
		}
		var o Owner
		if err := json.Unmarshal(val, &o); err != nil {
			w.log.Error("bad owner row", "key", key, "err", err)
			return
		}
		v.Shards[n] = Row{Owner: o, ModRevision: modRev}
	case strings.HasPrefix(key, routesPrefix(w.prefix)):
		cid := strings.TrimPrefix(key, routesPrefix(w.prefix))
		if deleted {
			delete(w.routes, cid)
			return
		}
		var o Override
		if err := json.Unmarshal(val, &o); err != nil {
			w.log.Error("bad override", "key", key, "err", err)
			return
		}
		o.Rev = modRev
		if w.routes == nil {
			w.routes = map[string]Override{}
		}
		w.routes[cid] = o
	case strings.HasPrefix(key, workersPrefix(w.prefix)):
		id := strings.TrimPrefix(key, workersPrefix(w.prefix))
		if deleted {
			delete(v.Workers, id)
			return
		}
		var i WorkerInfo
		if err := json.Unmarshal(val, &i); err != nil {
			w.log.Error("bad worker row", "key", key, "err", err)
			return
		}
		v.Workers[id] = i
	}
}

func (w *Watcher) notifyLocked() {
	if len(w.routes) == 0 {
		w.routed.Store(nil)
	} else {
		m := make(map[string]Override, len(w.routes))
		for k, o := range w.routes {
			m[k] = o
		}
		w.routed.Store(&m)
	}
	close(w.changed)
	w.changed = make(chan struct{})
}
