package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/lease"
)

// OpsConfig says where the pipeline's state is read from.
type OpsConfig struct {
	Etcd    *clientv3.Client
	Prefix  string // etcd key prefix (default lease.DefaultPrefix)
	VShards int
	// Dedicated is the number of dedicated vshards after the hashed ones
	// (lease.Config.Dedicated).
	Dedicated int
	Topic     string
	// DB, if set, is read for the consumers' offsets (consumer_offsets).
	DB *pgxpool.Pool
	// Brokers, if set, are asked for the topic's end offsets (the consumers'
	// lag needs both).
	Brokers []string
	// KafkaOpts are appended to the Kafka client's options (TLS, SASL).
	KafkaOpts []kgo.Opt
	// LocalMetrics, if set, returns this process's /metrics page; in
	// `chatpipe dev` it holds the in-process workers' and persist's metrics.
	LocalMetrics func(ctx context.Context) ([]byte, error)
	// HTTP scrapes the workers' advertised admin addresses (default: a
	// client with a 1 s timeout).
	HTTP *http.Client
	// Timeout bounds one collection (default 2 s).
	Timeout time.Duration
	// MaxAge: a state younger than this is served again instead of
	// collecting a new one, however many pages poll (default 750 ms).
	MaxAge time.Duration
	// Forget drops a gone worker from the list this long after it was last
	// seen (default 10 min).
	Forget time.Duration
	Log    *slog.Logger
	Now    func() time.Time
}

func (c *OpsConfig) validate() error {
	if c.Etcd == nil {
		return errors.New("web: ops needs an etcd client")
	}
	if c.VShards <= 0 {
		return errors.New("web: ops needs the number of vshards")
	}
	if c.Dedicated < 0 {
		return errors.New("web: ops: negative number of dedicated vshards")
	}
	if c.Prefix == "" {
		c.Prefix = lease.DefaultPrefix
	}
	if c.HTTP == nil {
		c.HTTP = &http.Client{Timeout: time.Second}
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 750 * time.Millisecond
	}
	if c.Forget <= 0 {
		c.Forget = 10 * time.Minute
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Ops collects State; safe for concurrent use.
type Ops struct {
	cfg OpsConfig

	mu      sync.Mutex // held while collecting: one collection at a time
	last    *State
	lastAt  time.Time
	seen    map[string]*seenWorker // by worker id
	history []rateSample           // oldest first, the last few seconds
}

type seenWorker struct {
	info    WorkerState
	metrics map[string]float64
	at      time.Time // when its metrics were read
	seenAt  time.Time // when it was last registered or named by a row
}

type rateSample struct {
	at       time.Time
	events   map[string]float64 // chatpipe_worker_events_total by worker
	accepted float64            // chatpipe_gateway_commands_total{result="accepted"} (-1: none)
	inserted float64            // chatpipe_persist_inserted_total (-1: none)
}

// NewOps returns an Ops reading from cfg's sources.
func NewOps(cfg OpsConfig) (*Ops, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Ops{cfg: cfg, seen: map[string]*seenWorker{}}, nil
}

// State returns the pipeline's state, collecting it if the last one is
// older than MaxAge. What cannot be read is listed in State.Errors.
func (o *Ops) State(ctx context.Context) *State {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.cfg.Now()
	if o.last != nil && now.Sub(o.lastAt) < o.cfg.MaxAge {
		return o.last
	}
	// The state is shared by every page: a poller that goes away must not
	// cancel the collection and leave an error-only state for the others.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.cfg.Timeout)
	defer cancel()
	s := o.collectLocked(ctx, now)
	o.last, o.lastAt = s, now
	return s
}

// registered is a workers/<id> row with its lease.
type registered struct {
	info    lease.WorkerInfo
	leaseID clientv3.LeaseID
	ttl     int64
}

func (o *Ops) collectLocked(ctx context.Context, now time.Time) *State {
	s := &State{Time: now.UTC(), VShards: o.cfg.VShards, Dedicated: o.cfg.Dedicated, Topic: o.cfg.Topic,
		Shards: make([]ShardState, o.cfg.VShards+o.cfg.Dedicated), Overrides: []OverrideState{}}
	for v := range s.Shards {
		s.Shards[v] = ShardState{VShard: v, Dedicated: v >= o.cfg.VShards}
	}
	errs := func(format string, args ...any) { s.Errors = append(s.Errors, fmt.Sprintf(format, args...)) }

	// Ownership from etcd, then the metrics (the workers' admin addresses
	// come from etcd) and the offsets, the last two side by side.
	workers, coord, err := o.readEtcd(ctx, s)
	if err != nil {
		errs("etcd: %v", err)
	}
	s.Coordinator = coord
	var (
		wg       sync.WaitGroup
		sample   = newMetricSample()
		scrapeOK = map[string]bool{}
		scrapeEr = map[string]string{}
	)
	var consumerErrs []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.Consumers, consumerErrs = o.readConsumers(ctx)
	}()
	var smu sync.Mutex
	scrape := func(id, addr string) {
		defer wg.Done()
		b, err := o.fetchMetrics(ctx, addr)
		smu.Lock()
		defer smu.Unlock()
		if err == nil {
			err = sample.parse(b)
		}
		if err != nil {
			scrapeEr[id] = err.Error()
			return
		}
		scrapeOK[id] = true
	}
	for id, r := range workers {
		if r.info.Admin != "" {
			wg.Add(1)
			go scrape(id, r.info.Admin)
		}
	}
	if o.cfg.LocalMetrics != nil {
		b, err := o.cfg.LocalMetrics(ctx)
		if err == nil {
			smu.Lock()
			err = sample.parse(b)
			smu.Unlock()
		}
		if err != nil {
			errs("local metrics: %v", err)
		}
	}
	wg.Wait()
	s.Errors = append(s.Errors, consumerErrs...)

	o.buildWorkers(s, workers, sample, scrapeOK, scrapeEr, now)
	o.buildRates(s, sample, now)
	if len(sample.global) > 0 {
		s.Gateway = map[string]float64{}
		for name, v := range sample.global {
			if strings.HasPrefix(name, "chatpipe_gateway_") && !strings.HasSuffix(name, "_sum") && !strings.HasSuffix(name, "_count") {
				s.Gateway[strings.TrimPrefix(name, "chatpipe_gateway_")] = v
			}
		}
		if v, ok := sample.global["chatpipe_persist_lag_records"]; ok {
			s.PersistLagRecords = &v
		}
	}
	return s
}

// readEtcd fills s.Shards and returns the registered workers and the
// coordinator.
func (o *Ops) readEtcd(ctx context.Context, s *State) (map[string]*registered, string, error) {
	resp, err := o.cfg.Etcd.Get(ctx, o.cfg.Prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, "", fmt.Errorf("read ownership: %w", err)
	}
	workers := map[string]*registered{}
	coord, coordRev := "", int64(0)
	for _, kv := range resp.Kvs {
		key := strings.TrimPrefix(string(kv.Key), o.cfg.Prefix)
		switch {
		case strings.HasPrefix(key, "shards/"):
			v, err := strconv.Atoi(strings.TrimPrefix(key, "shards/"))
			if err != nil || v < 0 || v >= len(s.Shards) {
				continue
			}
			var ow lease.Owner
			if json.Unmarshal(kv.Value, &ow) != nil {
				continue
			}
			s.Shards[v] = ShardState{VShard: v, Worker: ow.Worker, Gen: ow.Gen, Epoch: ow.Epoch, Dedicated: v >= o.cfg.VShards}
		case strings.HasPrefix(key, "routes/"):
			var ov lease.Override
			if json.Unmarshal(kv.Value, &ov) != nil {
				continue
			}
			s.Overrides = append(s.Overrides, OverrideState{Conversation: strings.TrimPrefix(key, "routes/"), VShard: ov.VShard, Since: ov.Since,
				Isolated: ov.VShard >= o.cfg.VShards && ov.VShard < len(s.Shards)})
		case strings.HasPrefix(key, "workers/"):
			var info lease.WorkerInfo
			if json.Unmarshal(kv.Value, &info) != nil {
				continue
			}
			workers[strings.TrimPrefix(key, "workers/")] = &registered{info: info, leaseID: clientv3.LeaseID(kv.Lease), ttl: -1}
		case strings.HasPrefix(key, "coordinator/"):
			// The election's leader is the candidate with the oldest key.
			if coord == "" || kv.CreateRevision < coordRev {
				coord, coordRev = string(kv.Value), kv.CreateRevision
			}
		}
	}
	for i, sh := range s.Shards {
		if r := workers[sh.Worker]; r != nil && r.info.Gen == sh.Gen {
			s.Shards[i].Live = true
		}
	}
	sort.Slice(s.Overrides, func(i, j int) bool { return s.Overrides[i].Conversation < s.Overrides[j].Conversation })
	for _, ov := range s.Overrides {
		if ov.Isolated {
			s.Shards[ov.VShard].Conversations = append(s.Shards[ov.VShard].Conversations, ov.Conversation)
		}
	}
	for _, r := range workers {
		if r.leaseID == 0 {
			continue
		}
		ttl, err := o.cfg.Etcd.TimeToLive(ctx, r.leaseID)
		if err == nil {
			r.ttl = ttl.TTL
		}
	}
	return workers, coord, nil
}

func (o *Ops) fetchMetrics(ctx context.Context, admin string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := o.cfg.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", admin, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", admin, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", admin, err)
	}
	return b, nil
}

// readConsumers reads consumer_offsets and the topic's end offsets, and
// says what it could not read.
func (o *Ops) readConsumers(ctx context.Context) (res []ConsumerState, errs []string) {
	if o.cfg.DB == nil {
		return nil, nil
	}
	report := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	ends := map[int32]int64{}
	if len(o.cfg.Brokers) > 0 {
		var err error
		if ends, err = o.endOffsets(ctx); err != nil {
			report("kafka: %v", err)
		}
	}
	stored, err := logsink.AllOffsets(ctx, o.cfg.DB, o.cfg.Topic)
	if err != nil {
		report("postgres: %v", err)
		return nil, errs
	}
	byName := map[string]*ConsumerState{}
	var out []*ConsumerState
	for _, so := range stored {
		c := byName[so.Consumer]
		if c == nil {
			c = &ConsumerState{Consumer: so.Consumer}
			byName[so.Consumer] = c
			out = append(out, c)
		}
		if so.UpdatedAt.After(c.UpdatedAt) {
			c.UpdatedAt = so.UpdatedAt
		}
		c.Partitions = append(c.Partitions, PartitionState{Partition: so.Partition, NextOffset: so.NextOffset, EndOffset: -1})
	}
	res = make([]ConsumerState, 0, len(out))
	for _, c := range out {
		if len(ends) > 0 {
			addMissingPartitions(c, ends)
		}
		for i := range c.Partitions {
			p := &c.Partitions[i]
			end, ok := ends[p.Partition]
			if !ok {
				p.Behind, c.Behind = -1, -1
				continue
			}
			p.EndOffset = end
			p.Behind = max(0, end-p.NextOffset-1)
			if c.Behind >= 0 {
				c.Behind += p.Behind
			}
		}
		res = append(res, *c)
	}
	return res, errs
}

// addMissingPartitions lists the partitions a consumer has no offset for
// yet (it starts them at 0).
func addMissingPartitions(c *ConsumerState, ends map[int32]int64) {
	have := map[int32]bool{}
	for _, p := range c.Partitions {
		have[p.Partition] = true
	}
	for part := range ends {
		if !have[part] {
			c.Partitions = append(c.Partitions, PartitionState{Partition: part, EndOffset: -1})
		}
	}
	sort.Slice(c.Partitions, func(i, j int) bool { return c.Partitions[i].Partition < c.Partitions[j].Partition })
}

// endOffsets returns the last stable offset of every partition of the
// topic: the end a read_committed consumer can reach.
func (o *Ops) endOffsets(ctx context.Context) (map[int32]int64, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(o.cfg.Brokers...)}, o.cfg.KafkaOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	listed, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, o.cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	if err := listed.Error(); err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	ends := map[int32]int64{}
	listed.Each(func(l kadm.ListedOffset) { ends[l.Partition] = l.Offset })
	return ends, nil
}

// buildWorkers lists the registered workers, those named by an owner row,
// and those seen within Forget, with their metrics.
func (o *Ops) buildWorkers(s *State, reg map[string]*registered, sample *metricSample, scrapeOK map[string]bool, scrapeEr map[string]string, now time.Time) {
	for id, r := range reg {
		sw := o.seenLocked(id)
		sw.seenAt = now
		sw.info = WorkerState{ID: id, State: WorkerLive, Addr: r.info.Addr, Admin: r.info.Admin, Gen: r.info.Gen, LeaseTTL: r.ttl}
		if r.info.Admin != "" && !scrapeOK[id] {
			sw.info.State = WorkerUnreachable
			sw.info.Error = scrapeEr[id]
		}
	}
	for _, sh := range s.Shards {
		if sh.Worker == "" {
			continue
		}
		sw := o.seenLocked(sh.Worker)
		sw.seenAt = now
		if _, ok := reg[sh.Worker]; !ok {
			sw.info.State = WorkerGone
			sw.info.LeaseTTL = -1
		}
	}
	for id, m := range sample.workers {
		sw := o.seenLocked(id)
		sw.metrics, sw.at = m, now
	}
	for id, sw := range o.seen {
		if _, ok := reg[id]; !ok {
			sw.info.State, sw.info.LeaseTTL, sw.info.Error = WorkerGone, -1, ""
		}
		if now.Sub(sw.seenAt) > o.cfg.Forget {
			delete(o.seen, id)
		}
	}
	for id, sw := range o.seen {
		w := sw.info
		w.ID = id
		for _, sh := range s.Shards {
			if sh.Worker == id {
				w.Rows++
				if sh.Live {
					w.Owned++
				}
			}
		}
		if sw.metrics != nil {
			w.Metrics = map[string]float64{}
			for k, v := range sw.metrics {
				w.Metrics[strings.TrimPrefix(k, "chatpipe_worker_")] = v
			}
			at := sw.at.UTC()
			w.MetricsAt = &at
			s.Totals.Events += w.Metrics["events_total"]
			s.Totals.FencedWrites += w.Metrics["fenced_writes_total"]
			s.Totals.Takeovers += w.Metrics["takeovers_total"]
			s.Totals.UnknownCommits += w.Metrics["unknown_commits_total"]
		}
		s.Workers = append(s.Workers, w)
	}
	sort.Slice(s.Workers, func(i, j int) bool { return s.Workers[i].ID < s.Workers[j].ID })
}

func (o *Ops) seenLocked(id string) *seenWorker {
	sw := o.seen[id]
	if sw == nil {
		sw = &seenWorker{info: WorkerState{ID: id, State: WorkerGone, LeaseTTL: -1}}
		o.seen[id] = sw
	}
	return sw
}

// rateWindow is how far back rates look.
const rateWindow = 5 * time.Second

// buildRates computes per-second rates against the oldest sample of the
// last rateWindow.
func (o *Ops) buildRates(s *State, sample *metricSample, now time.Time) {
	cur := rateSample{at: now, events: map[string]float64{}, accepted: -1, inserted: -1}
	for id, m := range sample.workers {
		if v, ok := m["chatpipe_worker_events_total"]; ok {
			cur.events[id] = v
		}
	}
	if v, ok := sample.global[gatewayAccepted]; ok {
		cur.accepted = v
	}
	if v, ok := sample.global["chatpipe_persist_inserted_total"]; ok {
		cur.inserted = v
	}
	keep := o.history[:0]
	for _, h := range o.history {
		if now.Sub(h.at) <= rateWindow {
			keep = append(keep, h)
		}
	}
	o.history = append(keep, cur)
	old := o.history[0]
	dt := now.Sub(old.at).Seconds()
	if dt <= 0 {
		return
	}
	rate := func(a, b float64) float64 {
		if a < 0 || b < a { // missing, or a counter that restarted
			return 0
		}
		return (b - a) / dt
	}
	perWorker := map[string]float64{}
	for id, v := range cur.events {
		if was, ok := old.events[id]; ok {
			perWorker[id] = rate(was, v)
			s.Rates.Events += perWorker[id]
		}
	}
	for i := range s.Workers {
		s.Workers[i].EventsPerSecond = perWorker[s.Workers[i].ID]
	}
	if cur.accepted >= 0 {
		s.Rates.GatewayAccepted = rate(old.accepted, cur.accepted)
	}
	if cur.inserted >= 0 {
		s.Rates.PersistInserted = rate(old.inserted, cur.inserted)
	}
}
