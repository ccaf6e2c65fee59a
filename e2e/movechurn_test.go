package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// moveChurn isolates conversations to dedicated vshards and releases them
// again (`chatpipe admin isolate` and `admin unisolate`) at random
// moments, as an operator would, whatever faults are active meanwhile. A
// command that times out waiting for its move (the writer that has the
// conversation paused, persist down) leaves the override standing; the
// churn runs a command for that conversation again later, and finish runs
// the last one that failed once more after the faults have healed.
type moveChurn struct {
	t          *testing.T
	ep         endpoints
	epPath     string
	cli        *clientv3.Client
	rng        *rand.Rand
	candidates []string
	stop, done chan struct{}

	mu     sync.Mutex
	routed map[string]bool   // conversations with an override in etcd
	failed map[string]string // conversation → its last command, if that failed
	counts map[string]int    // commands run, by outcome
	used   map[string]bool   // conversations ever isolated
}

// moveWait is how long each admin command of the churn waits for its move
// to be stored.
const moveWait = 20 * time.Second

// startMoveChurn moves conversations among candidates, at most as many at
// a time as there are dedicated vshards, every 3 to 10 s (drawn from rng).
func startMoveChurn(t *testing.T, dev *devProc, rng *rand.Rand, candidates []string) *moveChurn {
	t.Helper()
	if dev.EP.Dedicated == 0 {
		t.Fatal("the stack has no dedicated vshards to isolate conversations to")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: dev.EP.Etcd, DialTimeout: 5 * time.Second, TLS: dev.EP.EtcdTLS})
	if err != nil {
		t.Fatal(err)
	}
	m := &moveChurn{t: t, ep: dev.EP, epPath: filepath.Join(dev.Dir, "endpoints.json"), cli: cli, rng: rng, candidates: candidates,
		stop: make(chan struct{}), done: make(chan struct{}),
		routed: map[string]bool{}, failed: map[string]string{}, counts: map[string]int{}, used: map[string]bool{}}
	t.Cleanup(func() {
		select {
		case <-m.stop:
		default:
			close(m.stop)
		}
		<-m.done
		cli.Close()
	})
	go m.run()
	return m
}

func (m *moveChurn) run() {
	defer close(m.done)
	for {
		select {
		case <-m.stop:
			return
		case <-time.After(time.Duration(3000+m.rng.IntN(7000)) * time.Millisecond):
		}
		m.mu.Lock()
		var routed, free []string
		for _, c := range m.candidates {
			if m.routed[c] {
				routed = append(routed, c)
			} else {
				free = append(free, c)
			}
		}
		m.mu.Unlock()
		cmd, conv := "unisolate", ""
		if len(free) > 0 && len(routed) < m.ep.Dedicated && (len(routed) == 0 || m.rng.IntN(2) == 0) {
			cmd, conv = "isolate", free[m.rng.IntN(len(free))]
		} else {
			conv = routed[m.rng.IntN(len(routed))]
		}
		m.do(cmd, conv, moveWait)
	}
}

// do runs admin cmd on conv, waiting up to wait for the move, and records
// what it did; it returns the command's error.
func (m *moveChurn) do(cmd, conv string, wait time.Duration) error {
	start := time.Now()
	out, err := m.admin(cmd, conv, wait)
	o, rev, rerr := m.override(conv)
	m.mu.Lock()
	defer m.mu.Unlock()
	if cmd == "isolate" {
		m.used[conv] = true
	}
	outcome := cmd
	if err != nil {
		outcome += " failed"
		m.failed[conv] = cmd
	} else {
		delete(m.failed, conv)
	}
	m.counts[outcome]++
	if rerr == nil {
		m.routed[conv] = rev != 0
	}
	route := "no override"
	if rev != 0 {
		route = fmt.Sprintf("override to vshard %d", o.VShard)
	}
	m.t.Logf("admin %s %s (%v, then %s): %v %s", cmd, conv, time.Since(start).Round(time.Millisecond), route, err, out)
	return err
}

func (m *moveChurn) admin(cmd, conv string, wait time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait+30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "admin", cmd, "--endpoints", m.epPath, "--wait", wait.String(), conv).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func (m *moveChurn) override(conv string) (lease.Override, int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return lease.OverrideRev(ctx, m.cli, lease.DefaultPrefix, conv)
}

// finish stops the churn and runs once more the last command of every
// conversation whose last command failed, as an operator finishes a move
// that timed out: with the faults healed each must succeed. It returns
// the commands run, by outcome, and the conversations ever isolated.
func (m *moveChurn) finish() (map[string]int, []string) {
	close(m.stop)
	<-m.done
	m.mu.Lock()
	var again []string
	for c := range m.failed {
		again = append(again, c)
	}
	m.mu.Unlock()
	sort.Strings(again)
	for _, conv := range again {
		m.mu.Lock()
		cmd := m.failed[conv]
		m.mu.Unlock()
		if err := m.do(cmd, conv, 2*time.Minute); err != nil {
			m.t.Errorf("admin %s %s, run again after the faults healed: %v; %s", cmd, conv, err, convWhere(m.ep, conv))
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var used []string
	for c := range m.used {
		used = append(used, c)
	}
	sort.Strings(used)
	return m.counts, used
}

// convWhere says where a conversation is routed and written, for a
// failure message: its hashed vshard, its override in etcd, and its
// location in Postgres (the target of its last stored moved record).
func convWhere(ep endpoints, conv string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	parts := []string{fmt.Sprintf("hashed vshard %d", logrecord.VShard(conv, ep.VShards))}
	if cli, err := clientv3.New(clientv3.Config{Endpoints: ep.Etcd, DialTimeout: 5 * time.Second, TLS: ep.EtcdTLS}); err != nil {
		parts = append(parts, "override: "+err.Error())
	} else {
		o, rev, err := lease.OverrideRev(ctx, cli, lease.DefaultPrefix, conv)
		switch {
		case err != nil:
			parts = append(parts, "override: "+err.Error())
		case rev == 0:
			parts = append(parts, "no override in etcd")
		default:
			parts = append(parts, fmt.Sprintf("override %s → vshard %d (since %s, revision %d)",
				lease.RouteKey(lease.DefaultPrefix, conv), o.VShard, o.Since.UTC().Format("15:04:05.000"), rev))
		}
		cli.Close()
	}
	conn, err := pgx.Connect(ctx, ep.Postgres)
	if err != nil {
		return strings.Join(append(parts, "Postgres: "+err.Error()), "; ")
	}
	defer conn.Close(context.Background())
	var to *int32
	var seq, last int64
	err = conn.QueryRow(ctx, `SELECT to_vshard, seq, (SELECT max(seq) FROM events WHERE conversation_id = $1)
		FROM events WHERE conversation_id = $1 AND kind = 'moved' ORDER BY seq DESC LIMIT 1`, conv).Scan(&to, &seq, &last)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		parts = append(parts, "Postgres: never moved")
	case err != nil:
		parts = append(parts, "Postgres: "+err.Error())
	case to == nil:
		parts = append(parts, fmt.Sprintf("Postgres: moved record at seq %d without a target (last seq %d)", seq, last))
	default:
		parts = append(parts, fmt.Sprintf("Postgres: last moved record at seq %d, to vshard %d (last seq %d)", seq, *to, last))
	}
	return strings.Join(parts, "; ")
}

// checkWritable sends one message to each conversation in senders, as the
// user it names (a current member), and requires each to be accepted
// within bound, sent again with the same ids while it is answered
// unavailable or rate_limited (as a client does). A conversation that
// answers anything else, or still retry when bound is over, fails the
// test with its last answer, its override and its location. It returns
// the accepted sends and the number of conversations that failed.
func checkWritable(t *testing.T, dev *devProc, senders map[string]string, bound time.Duration) ([]acceptedMsg, int) {
	t.Helper()
	var convs []string
	for c := range senders {
		convs = append(convs, c)
	}
	sort.Strings(convs)
	var mu sync.Mutex
	var accepted []acceptedMsg
	var failed []string
	var wg sync.WaitGroup
	deadline := time.Now().Add(bound)
	for _, conv := range convs {
		user := senders[conv]
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmid := "writable-" + conv
			sent := time.Now()
			var last string
			var cl *client
			for tries := 1; ; tries++ {
				var r *protocol.Reply
				var err error
				if cl == nil {
					cl, err = dev.dialErr(t, user)
				}
				if err == nil {
					r, err = cl.Do(map[string]any{"op": "send", "conversation_id": conv, "client_message_id": cmid, "body": "after the faults"})
				}
				switch {
				case err != nil:
					if cl != nil {
						cl.Close()
					}
					cl, last = nil, err.Error()
				case r.Op == protocol.OpAccepted:
					mu.Lock()
					accepted = append(accepted, acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: user, Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
					mu.Unlock()
					return
				case r.Code != protocol.CodeUnavailable && r.Code != protocol.CodeRateLimited:
					t.Errorf("%s is not writable: a send by %s was answered %s %q; %s", conv, user, r.Code, r.Message, convWhere(dev.EP, conv))
					mu.Lock()
					failed = append(failed, conv)
					mu.Unlock()
					return
				default:
					last = fmt.Sprintf("%s %q", r.Code, r.Message)
				}
				if time.Now().After(deadline) {
					t.Errorf("%s is not writable: a send by %s was not accepted within %v of the faults healing (%d tries; the last answered %s); %s",
						conv, user, bound, tries, last, convWhere(dev.EP, conv))
					mu.Lock()
					failed = append(failed, conv)
					mu.Unlock()
					return
				}
				wait := 200 * time.Millisecond
				if r != nil && r.RetryAfterMS > 0 {
					wait = time.Duration(r.RetryAfterMS) * time.Millisecond
				}
				time.Sleep(wait)
			}
		}()
	}
	wg.Wait()
	return accepted, len(failed)
}
