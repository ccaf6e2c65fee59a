package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// waitProjected waits until Postgres holds n events and the read model
// covers every event it holds (each conversation's last_seq is its last
// event).
func waitProjected(t *testing.T, ep endpoints, n int) {
	t.Helper()
	waitProjectedFor(t, ep, n, 90*time.Second)
}

// waitProjectedFor is waitProjected with a bound of its own.
func waitProjectedFor(t *testing.T, ep endpoints, n int, bound time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	conn, err := pgx.Connect(ctx, ep.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for {
		var have, behind int
		err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM events),
			(SELECT count(*) FROM (SELECT conversation_id, max(seq) m FROM events GROUP BY conversation_id) e
			 LEFT JOIN conversations c USING (conversation_id) WHERE c.last_seq IS DISTINCT FROM e.m)`).Scan(&have, &behind)
		if err != nil {
			t.Fatal(err)
		}
		if have >= n && behind == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("read model not caught up: %d of %d events in Postgres, %d conversations behind: %s", have, n, behind, readModelBehind(ep))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readModelBehind says which conversations the read model has not caught
// up with (up to ten: its last_seq and the last stored seq), then persist's
// stored offsets.
func readModelBehind(ep endpoints) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, ep.Postgres)
	if err != nil {
		return err.Error()
	}
	defer conn.Close(context.Background())
	var b strings.Builder
	rows, err := conn.Query(ctx, `SELECT e.conversation_id, coalesce(c.last_seq, 0), e.m
		FROM (SELECT conversation_id, max(seq) m FROM events GROUP BY conversation_id) e
		LEFT JOIN conversations c USING (conversation_id)
		WHERE c.last_seq IS DISTINCT FROM e.m ORDER BY 1 LIMIT 10`)
	if err != nil {
		return err.Error()
	}
	for rows.Next() {
		var conv string
		var projected, stored int64
		if err := rows.Scan(&conv, &projected, &stored); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "%s projected to seq %d of %d; ", conv, projected, stored)
	}
	if err := rows.Err(); err != nil {
		return err.Error()
	}
	return b.String() + "stored offsets:\n" + storedOffsets(ep)
}

// TestDeliveryConverges: 20 users with 3 devices each across 30
// conversations (1:1 and groups up to 100 members) send, join, kick and
// leave while devices disconnect and reconnect at random. Afterwards every
// device's view of every conversation, built only from event frames, sync
// and history, equals the committed log and Postgres within the user's
// membership periods (I6), and nobody holds an event from outside them.
func TestDeliveryConverges(t *testing.T) {
	sharing(t, 45, 14)
	deliveryConverges(t, startDev(t, t.TempDir()))
}

// deliveryConverges runs TestDeliveryConverges's scenario on dev's stack
// (the secured one's: TestSecuredDeliveryConverges).
func deliveryConverges(t *testing.T, dev *devProc) {
	rng := rand.New(rand.NewPCG(4, 2))
	// Device 0 of the first `steady` users stays connected from the start:
	// what it holds comes from one sync before any event and then live
	// delivery alone, so a gap in delivery would show there.
	const nUsers, nDevices, nConvs, perUser, steady = 20, 3, 30, 30, 5
	users := make([]string, nUsers)
	devs := map[string][]*device{}
	var all []*device
	for i := range users {
		users[i] = fmt.Sprintf("u%02d", i)
		for j := 0; j < nDevices; j++ {
			d := newDevice(t, dev, users[i], fmt.Sprintf("u%02d.d%d", i, j))
			if err := d.connect(); err != nil {
				t.Fatal(err)
			}
			devs[users[i]] = append(devs[users[i]], d)
			all = append(all, d)
		}
	}
	t.Cleanup(func() {
		for _, d := range all {
			d.disconnect()
		}
	})
	outsider := newDevice(t, dev, "outsider", "outsider")
	if err := outsider.connect(); err != nil {
		t.Fatal(err)
	}
	defer outsider.disconnect()

	// Conversations: 15 one-to-one, 15 groups, two of them with 100 members
	// (the rest of them users who never connect).
	type conv struct {
		id    string
		owner string
		mu    sync.Mutex
		real  map[string]bool // connected users who are members now
	}
	convs := make([]*conv, nConvs)
	for i := range convs {
		c := &conv{id: fmt.Sprintf("dc%02d", i), real: map[string]bool{}}
		perm := rng.Perm(nUsers)
		c.owner = users[perm[0]]
		var members []string
		n := 1
		if i >= nConvs/2 {
			n = 2 + rng.IntN(nUsers-3)
		}
		for _, k := range perm[1 : 1+n] {
			members = append(members, users[k])
		}
		if i >= nConvs-2 {
			for len(members) < 99 {
				members = append(members, fmt.Sprintf("ghost%02d.%d", i, len(members)))
			}
		}
		c.real[c.owner] = true
		for _, m := range members[:n] {
			c.real[m] = true
		}
		f, err := devs[c.owner][0].doRetrying(map[string]any{"op": "create", "conversation_id": c.id, "members": members})
		if err != nil || f.Op != protocol.OpAccepted {
			t.Fatalf("create %s: %v %+v", c.id, err, f)
		}
		convs[i] = c
	}

	stop := make(chan struct{})
	var bg sync.WaitGroup
	// Devices 1 and 2 of every user drop and come back at random.
	bg.Add(1)
	go func() {
		defer bg.Done()
		r := rand.New(rand.NewPCG(7, 7))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(20+r.IntN(60)) * time.Millisecond):
			}
			d := devs[users[r.IntN(nUsers)]][1+r.IntN(nDevices-1)]
			d.disconnect()
			bg.Add(1)
			go func(d *device, wait time.Duration) {
				defer bg.Done()
				time.Sleep(wait)
				if err := d.connect(); err != nil {
					t.Errorf("reconnect %s: %v", d.name, err)
				}
			}(d, time.Duration(r.IntN(700))*time.Millisecond)
		}
	}()
	// Membership churn in the groups: kicks, leaves and joins.
	bg.Add(1)
	go func() {
		defer bg.Done()
		r := rand.New(rand.NewPCG(9, 9))
		for k := 0; k < 24; k++ {
			select {
			case <-stop:
				return
			case <-time.After(150 * time.Millisecond):
			}
			c := convs[nConvs/2+r.IntN(nConvs/2)]
			u := users[r.IntN(nUsers)]
			if u == c.owner {
				continue
			}
			c.mu.Lock()
			member := c.real[u]
			c.mu.Unlock()
			var f *frame
			var err error
			switch {
			case member && k%3 == 0:
				f, err = devs[u][0].doRetrying(map[string]any{"op": "leave", "conversation_id": c.id})
			case member:
				f, err = devs[c.owner][0].doRetrying(map[string]any{"op": "kick", "conversation_id": c.id, "user_id": u})
			default:
				f, err = devs[c.owner][0].doRetrying(map[string]any{"op": "join", "conversation_id": c.id, "user_id": u})
			}
			if err != nil {
				continue // the device was reconnecting; the next round goes on
			}
			if f.Op == protocol.OpAccepted {
				c.mu.Lock()
				c.real[u] = !member
				c.mu.Unlock()
			}
		}
	}()
	// Every user sends perUser messages at a steady pace to conversations
	// they are in; device 0 also drops now and then (and the sender retries
	// with the same ids after reconnecting).
	var senders sync.WaitGroup
	for i, u := range users {
		senders.Add(1)
		go func() {
			defer senders.Done()
			r := rand.New(rand.NewPCG(uint64(i), 1))
			d := devs[u][0]
			for m := 0; m < perUser; m++ {
				time.Sleep(time.Duration(100+r.IntN(200)) * time.Millisecond)
				var mine []*conv
				for _, c := range convs {
					c.mu.Lock()
					if c.real[u] {
						mine = append(mine, c)
					}
					c.mu.Unlock()
				}
				if len(mine) == 0 {
					continue
				}
				c := mine[r.IntN(len(mine))]
				if m%10 == 9 && i >= steady {
					d.disconnect()
				}
				for {
					if err := d.connect(); err != nil {
						t.Errorf("%s: %v", d.name, err)
						return
					}
					f, err := d.doRetrying(map[string]any{"op": "send", "conversation_id": c.id,
						"client_message_id": fmt.Sprintf("%s-m%d", u, m), "body": fmt.Sprintf("%s says %d", u, m)})
					if err == errClosed {
						continue
					}
					if err != nil {
						t.Errorf("%s: %v", d.name, err)
						return
					}
					if f.Op != protocol.OpAccepted && f.Code != string(protocol.CodeForbidden) {
						t.Errorf("%s send: %+v", d.name, f)
					}
					break
				}
			}
		}()
	}
	senders.Wait()
	close(stop)
	bg.Wait()

	logRows := readLog(t, dev.EP)
	dbRows := readDB(t, dev.EP, len(logRows))
	waitProjected(t, dev.EP, len(logRows))
	if len(dbRows) != len(logRows) {
		t.Fatalf("Postgres holds %d events, the log %d", len(dbRows), len(logRows))
	}
	byConv := map[string][]row{}
	dbByKey := map[string]row{}
	for _, r := range dbRows {
		dbByKey[fmt.Sprintf("%s/%d", r.Conv, r.Seq)] = r
	}
	for _, r := range logRows {
		byConv[r.Conv] = append(byConv[r.Conv], r)
		if d, ok := dbByKey[fmt.Sprintf("%s/%d", r.Conv, r.Seq)]; !ok || d.MessageID != r.MessageID || d.Body != r.Body {
			t.Errorf("log %s/%d differs from Postgres: %+v vs %+v", r.Conv, r.Seq, r, d)
		}
	}
	per := periods(logRows)
	mismatch := func(d *device) string {
		for conv, rows := range byConv {
			want := visibleTo(rows, per[conv][d.user])
			got := d.seqs(conv)
			if len(got) != len(want) {
				return fmt.Sprintf("%s holds %d events of %s, may see %d", d.name, len(got), conv, len(want))
			}
			for _, s := range got {
				if _, ok := want[s]; !ok {
					return fmt.Sprintf("%s holds %s/%d, outside its periods", d.name, conv, s)
				}
			}
		}
		return ""
	}
	for _, u := range users[:steady] {
		d := devs[u][0]
		deadline := time.Now().Add(30 * time.Second)
		for mismatch(d) != "" && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		d.mu.Lock()
		n := d.conns
		d.mu.Unlock()
		if m := mismatch(d); m != "" {
			t.Errorf("live delivery alone (%d connections): %s", n, m)
		}
	}

	// Every device reconnects, syncs, reads history, and must hold exactly
	// what its user may see.
	var lat []time.Duration
	conns := 0
	var vmu sync.Mutex
	var verify sync.WaitGroup
	for _, u := range users {
		verify.Add(1)
		go func() { // users in parallel: each one's commands share its rate limit
			defer verify.Done()
			for _, d := range devs[u] {
				if err := d.connect(); err != nil {
					t.Error(err)
					return
				}
				if err := d.syncAll(); err != nil {
					t.Error(err)
					return
				}
				for conv, ps := range per {
					if len(ps[d.user]) == 0 {
						continue
					}
					if _, err := d.history(conv, 25); err != nil {
						t.Error(err)
						return
					}
				}
				for conv, rows := range byConv {
					want := visibleTo(rows, per[conv][d.user])
					got := d.seqs(conv)
					if len(got) != len(want) {
						t.Errorf("%s holds %d events of %s, may see %d", d.name, len(got), conv, len(want))
						continue
					}
					for _, s := range got {
						w, ok := want[s]
						e := d.get(conv, s)
						if !ok || e.MessageID != w.MessageID || e.Body != w.Body || e.Kind != w.Kind || e.Sender != w.Sender {
							t.Errorf("%s holds %s/%d = %+v; the log has %+v (visible %v)", d.name, conv, s, e, w, ok)
						}
					}
				}
				for _, conv := range d.convs() {
					if len(per[conv][d.user]) == 0 {
						t.Errorf("%s holds events of %s, never its conversation", d.name, conv)
					}
				}
				d.mu.Lock()
				vmu.Lock()
				lat = append(lat, d.live...)
				conns += d.conns
				vmu.Unlock()
				d.mu.Unlock()
			}
		}()
	}
	verify.Wait()
	// The outsider got nothing and may read nothing.
	if c := outsider.convs(); len(c) != 0 {
		t.Errorf("the outsider received events of %v", c)
	}
	if err := outsider.syncAll(); err != nil {
		t.Fatal(err)
	}
	if len(outsider.cursors) != 0 || len(outsider.convs()) != 0 {
		t.Errorf("the outsider's sync returned %v", outsider.cursors)
	}
	f, err := outsider.do(map[string]any{"op": "history", "conversation_id": convs[0].id})
	if err != nil || f.Code != string(protocol.CodeForbidden) {
		t.Errorf("the outsider's history: %v %+v", err, f)
	}
	t.Logf("%d events, %d devices, %d connections; delivery (created_at → device) p50 %v p99 %v over %d live frames",
		len(logRows), len(all), conns, percentile(lat, 0.5), percentile(lat, 0.99), len(lat))
}

// TestSecuredDeliveryConverges is TestDeliveryConverges in the secured
// mode: pushes to devices and sync over a gateway whose link to the worker
// is mutual TLS, from persist reading with its own user. The gateway and
// the worker export the time left on their link certificates (made valid
// for 24 h).
func TestSecuredDeliveryConverges(t *testing.T) {
	sharing(t, 40, 21)
	s := startSecuredForChecks(t)
	s.startWorker("w1")
	s.startRole(clustersec.RolePersist)
	stacktest.WaitFor(t, 60*time.Second, "w1 to register", func() bool { _, ok := stacktest.EtcdView(t, s.dev.EP).Workers["w1"]; return ok })
	for role, url := range map[string]string{"gateway": s.dev.EP.Admin + "/metrics", "worker": stacktest.AdminURL(t, s.dev.EP, "w1")} {
		left := time.Duration(stacktest.Metric(t, url, `chatpipe_link_cert_expiry_seconds{role="`+role+`"}`) * float64(time.Second))
		if left < 23*time.Hour || left > 24*time.Hour {
			t.Errorf("the %s's chatpipe_link_cert_expiry_seconds says %v left, want just under 24h", role, left)
		}
	}
	deliveryConverges(t, s.dev)
}
