// Package ownership holds who owns which virtual shard, as plain values: the
// owner rows and live workers (View), and the pure planner (Plan) that
// decides which vshards change owner. It imports no etcd client: package
// lease stores and watches these values in etcd; the simulation and the
// coordinator's planning use them as they are.
package ownership

// WorkerInfo is the value of workers/<id>, attached to the worker's lease.
type WorkerInfo struct {
	Addr  string `json:"addr"`
	Gen   int64  `json:"gen"`
	Admin string `json:"admin,omitempty"` // the worker's /metrics, /healthz, /readyz server, if any
}

// Owner is the value of shards/<n>.
type Owner struct {
	Worker string `json:"worker"`
	Gen    int64  `json:"gen"`
	Epoch  int64  `json:"epoch"`
}

// Row is an owner row with the revision a compare-and-swap must match.
type Row struct {
	Owner
	ModRevision int64
}

// View is a snapshot of the owner rows and the live workers.
type View struct {
	Shards  map[int]Row
	Workers map[string]WorkerInfo
	// Pinned vshards are not moved to balance load (Plan); the coordinator
	// pins a vshard an operator handed off, for a while.
	Pinned map[int]bool
}

// Live reports whether vshard v has a live owner, and returns it.
func (v *View) Live(vshard int) (Row, WorkerInfo, bool) {
	row, ok := v.Shards[vshard]
	if !ok {
		return Row{}, WorkerInfo{}, false
	}
	w, ok := v.Workers[row.Worker]
	if !ok || w.Gen != row.Gen {
		return row, WorkerInfo{}, false
	}
	return row, w, true
}
