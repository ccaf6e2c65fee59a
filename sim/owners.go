package sim

import "github.com/chatpipe/chatpipe/internal/ownership"

type workerLease struct {
	gen     int64
	expires int64
}

// OwnerStore is the stand-in for etcd's ownership keys (lease/keys.go; docs/operations.md, "Ownership"):
// one lease per worker that expires on the simulated clock unless renewed,
// a gen counter per worker id, and one owner row per vshard, changed only by
// compare-and-swap on the row's revision (ownership.Plan makes the epoch +1).
type OwnerStore struct {
	ttl     int64
	rev     int64
	gens    map[string]int64
	workers map[string]workerLease
	rows    map[int]ownership.Row
}

// NewOwnerStore returns an empty store whose leases live ttl ticks.
func NewOwnerStore(ttl int64) *OwnerStore {
	return &OwnerStore{ttl: ttl, gens: map[string]int64{}, workers: map[string]workerLease{}, rows: map[int]ownership.Row{}}
}

// Rev is the store's revision; it changes with every write.
func (o *OwnerStore) Rev() int64 { return o.rev }

// Register takes a new gen for id and a fresh lease (workers/<id>), as
// lease.Register does.
func (o *OwnerStore) Register(id string, now int64) int64 {
	o.gens[id]++
	o.rev++
	o.workers[id] = workerLease{gen: o.gens[id], expires: now + o.ttl}
	return o.gens[id]
}

// KeepAlive renews the lease of (id, gen); false when it is gone.
func (o *OwnerStore) KeepAlive(id string, gen, now int64) bool {
	l, ok := o.workers[id]
	if !ok || l.gen != gen || l.expires <= now {
		return false
	}
	l.expires = now + o.ttl
	o.workers[id] = l
	return true
}

// Expire deletes every lease that ran out at now.
func (o *OwnerStore) Expire(now int64) {
	for _, id := range sortedKeys(o.workers) {
		if o.workers[id].expires <= now {
			delete(o.workers, id)
			o.rev++
		}
	}
}

// View returns a snapshot of the owner rows and the live workers.
func (o *OwnerStore) View() ownership.View {
	v := ownership.View{Shards: make(map[int]ownership.Row, len(o.rows)), Workers: make(map[string]ownership.WorkerInfo, len(o.workers))}
	for s, r := range o.rows {
		v.Shards[s] = r
	}
	for id, l := range o.workers {
		v.Workers[id] = ownership.WorkerInfo{Addr: id, Gen: l.gen}
	}
	return v
}

// CAS applies a move if the row is still at the revision the plan saw (0:
// no row yet), like the coordinator's transaction.
func (o *OwnerStore) CAS(m ownership.Move) bool {
	if o.rows[m.VShard].ModRevision != m.ModRevision {
		return false
	}
	o.rev++
	o.rows[m.VShard] = ownership.Row{Owner: ownership.Owner{Worker: m.To, Gen: m.Gen, Epoch: m.Epoch}, ModRevision: o.rev}
	return true
}

// Owner is a linearizable read of shards/<v>.
func (o *OwnerStore) Owner(v int) (ownership.Owner, bool) {
	r, ok := o.rows[v]
	return r.Owner, ok
}
