package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// freezer is a TCP proxy whose connections can be frozen: a frozen
// connection stays open but carries nothing either way, like a link whose
// peer vanished without a FIN (a half-open link). Connections opened after
// a freeze pass.
type freezer struct {
	ln     net.Listener
	target string
	gen    atomic.Int64 // connections opened so far
	frozen atomic.Int64 // connections numbered up to this are frozen
	stop   chan struct{}
	mu     sync.Mutex
	conns  []net.Conn
}

func startFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target, stop: make(chan struct{})}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(f.stop)
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			n := f.gen.Add(1)
			f.mu.Lock()
			f.conns = append(f.conns, c, up)
			f.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				buf := make([]byte, 32<<10)
				for {
					k, err := src.Read(buf)
					if k > 0 {
						if n <= f.frozen.Load() {
							<-f.stop // hold the bytes: nothing gets through, nothing closes
							return
						}
						if _, err := dst.Write(buf[:k]); err != nil {
							return
						}
					}
					if err != nil {
						dst.Close()
						return
					}
				}
			}
			wg.Add(2)
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	return f
}

// freeze makes every connection opened so far half-open.
func (f *freezer) freeze() { f.frozen.Store(f.gen.Load()) }

func (f *freezer) addr() string { return f.ln.Addr().String() }

// TestLinkFaults: a gateway link that stops reading its answers is closed
// by the worker without holding up anyone else's answers, and a pooled
// link that went half-open is found by the gateway's health check and
// replaced, so commands are answered well within the call timeout.
func TestLinkFaults(t *testing.T) {
	alone(t, 10)
	dev := startDev(t, t.TempDir(), "--workers", "0", "--wire-ping", "500ms", "--wire-read-timeout", "3s", "--call-timeout", "15s")
	listen := stacktest.FreePort(t)
	proxy := startFreezer(t, "127.0.0.1:"+strconv.Itoa(listen))
	stacktest.StartProc(t, dev.Dir, "wa", nil, "worker", "--endpoints", dev.Dir+"/endpoints.json", "--id", "wa", "--log-level", "warn",
		"--listen", "127.0.0.1:"+strconv.Itoa(listen), "--advertise", proxy.addr(), "--wire-queue", "256", "--wire-write-timeout", "2s")
	stacktest.WaitOwned(t, 120*time.Second, "wa to own every vshard", dev.EP, dev.EP.All(), "wa", dev.EP.All())

	alice := dev.Dial(t, "alice")
	alice.Must(map[string]any{"op": "create", "conversation_id": "lk", "members": []string{}})
	seq := 0
	send := func() time.Duration {
		t.Helper()
		seq++
		start := time.Now()
		r, err := alice.SendRetrying("lk", fmt.Sprint("m", seq), "x")
		if err != nil || r.Op != protocol.OpAccepted {
			t.Fatalf("send %d: %+v %v", seq, r, err)
		}
		return time.Since(start)
	}
	send()

	// 1. A "gateway" that floods the worker and never reads an answer.
	raw, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(listen))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	flooded := make(chan error, 1)
	go func() {
		bw := bufio.NewWriter(raw)
		for i := 1; i <= 200000; i++ {
			b, _ := json.Marshal(&link.Request{RID: uint64(i), User: "mallory", Budget: time.Minute,
				Req: &protocol.Request{Op: protocol.OpSend, ID: "f", ConversationID: "lk", ClientMessageID: "f" + strconv.Itoa(i), Body: "flood"}})
			bw.Write(append(b, '\n'))
		}
		flooded <- bw.Flush()
	}()
	var worst time.Duration
	for i := 0; i < 20; i++ {
		worst = max(worst, send())
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("while a link flooded the worker without reading: slowest answer to another gateway %v", worst)
	if worst > 3*time.Second {
		t.Errorf("a link that does not read held up another gateway's answers: %v", worst)
	}
	// The worker closed the flooding link: reading it ends (after what it
	// had buffered) instead of blocking forever.
	raw.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, raw); err != nil {
		t.Errorf("the flooding link was not closed by the worker: %v", err)
	}
	<-flooded

	// 2. The gateway's pooled link goes half-open.
	proxy.freeze()
	d := send()
	t.Logf("first answer after the link went half-open: %v", d)
	if d > 10*time.Second {
		t.Errorf("the half-open link was not replaced in time: the send took %v (call timeout 15 s)", d)
	}
	for i := 0; i < 5; i++ {
		if d := send(); d > time.Second {
			t.Errorf("a send over the replaced link took %v", d)
		}
	}
}
