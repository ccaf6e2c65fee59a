package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestSlowDeviceGetsEachConversationInSeqOrder: on a gateway with a small
// send buffer (--send-buffer 16), two devices of one user (one frame per
// message, and batching) read slowly and in spurts, on sockets with a
// small receive buffer, while another user sends a burst of 32 KB
// messages into three conversations they share, kept a few MB ahead of
// the devices, and a third device of the user moves its read markers
// along. Pushes find the slow devices' send buffers full again and again
// and are read back from Postgres as they drain, while new pushes keep
// coming. Each slow device still gets, per conversation, every event, each
// for the first time only after every lower seq (repeats allowed, never a
// higher seq before a lower one), read markers that never go back and the
// last marker; neither is closed.
func TestSlowDeviceGetsEachConversationInSeqOrder(t *testing.T) {
	sharing(t, 50, 22)
	dev := startDev(t, t.TempDir(), "--send-buffer", "16", "--rate-user", "-1", "--rate-conv", "-1", "--max-body-bytes", "32768")
	convs := []string{"slow-a", "slow-b", "slow-c"}
	metricsURL := dev.EP.Admin + "/metrics"
	backlogs := stacktest.Metric(t, metricsURL, "chatpipe_gateway_backlogs_total")

	// The slow devices connect first: everything they get, from each
	// conversation's create on, is pushed.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	devices := []*slowDevice{
		dialSlowDevice(ctx, t, dev, "reader", "plain", nil),
		dialSlowDevice(ctx, t, dev, "reader", "batching", []string{protocol.SubprotocolBatch}),
	}
	var readers sync.WaitGroup
	for _, d := range devices {
		readers.Add(1)
		go func() {
			defer readers.Done()
			d.read(ctx)
		}()
	}
	defer readers.Wait()
	defer cancel() // ends the readers if the test fails before they finish

	var mu sync.Mutex
	last := map[string]int64{} // per conversation, the highest seq accepted
	accepted := func(c string, seq int64) {
		mu.Lock()
		defer mu.Unlock()
		last[c] = max(last[c], seq)
	}
	sender := dev.Dial(t, "sender")
	for _, c := range convs {
		r := sender.Must(map[string]any{"op": "create", "conversation_id": c, "members": []string{"reader"}})
		accepted(c, r.Seq)
	}
	// The reader's phone: moves the user's read marker of each
	// conversation to the highest seq accepted so far, while the burst
	// goes on.
	phone := dev.Dial(t, "reader")
	burst := make(chan struct{})
	var marking sync.WaitGroup
	marking.Add(1)
	go func() {
		defer marking.Done()
		for i := 0; ; i++ {
			select {
			case <-burst:
				return
			case <-time.After(20 * time.Millisecond):
			}
			c := convs[i%len(convs)]
			mu.Lock()
			seq := last[c]
			mu.Unlock()
			if seq == 0 {
				continue
			}
			r, err := phone.Do(map[string]any{"op": "read", "conversation_id": c, "seq": seq})
			if err != nil || r.Op != protocol.OpAccepted && r.Code != protocol.CodeUnavailable {
				t.Errorf("read %s at %d: %v %+v", c, seq, err, r)
				return
			}
		}
	}()

	// The burst: 1200 messages of 32 KB (38 MB) sent one after another,
	// each once the plain device is fewer than a target count of events
	// behind, the target growing from 40 to 200 over the burst. On
	// loopback the gateway's socket buffer grows to a few MB (about 100
	// such messages): somewhere along the way the device's backlog is
	// read back while that buffer is still full, and the next pushes
	// start a backlog again while the gateway's writer waits for the
	// device.
	const n = 1200
	body := strings.Repeat("x", 32000)
	for m := range n {
		target := int64(40 + 160*m/n)
		for start := time.Now(); devices[0].behind(last) >= target; {
			if devices[0].failed() != nil || ctx.Err() != nil {
				break
			}
			if time.Since(start) > time.Minute {
				t.Fatalf("before message %d: the plain device stayed %d events behind for a minute (%s)", m, devices[0].behind(last), devices[0].complete(convs, last))
			}
			time.Sleep(2 * time.Millisecond) // pacing the burst to the device
		}
		if devices[0].failed() != nil || ctx.Err() != nil {
			break
		}
		c := convs[m%len(convs)]
		r, err := sender.SendRetrying(c, fmt.Sprintf("m%d", m), body)
		if err != nil || r.Op != protocol.OpAccepted {
			t.Fatalf("send %d to %s: %v %+v", m, c, err, r)
		}
		accepted(c, r.Seq)
	}
	close(burst)
	marking.Wait()
	for _, d := range devices {
		d.burst.Store(false)
	}
	if t.Failed() {
		return
	}
	for _, c := range convs { // the last marker: every conversation read to its end
		phone.Must(map[string]any{"op": "read", "conversation_id": c, "seq": last[c]})
	}

	for _, d := range devices {
		stacktest.WaitForOr(t, 2*time.Minute, d.name+" device to receive every event and the last read marker", func() bool {
			return d.complete(convs, last) == "" || d.failed() != nil
		}, func() string {
			return fmt.Sprintf("%s; backlogs %v; the gateway's log:\n%s", d.complete(convs, last),
				stacktest.Metric(t, metricsURL, "chatpipe_gateway_backlogs_total")-backlogs,
				grepLines(filepath.Join(dev.Dir, "dev.log"), "slow websocket reader", "read back", "delivery"))
		})
		if err := d.failed(); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s device: %d frames, %d repeated events", d.name, d.received(), d.repeats())
	}
	got := stacktest.Metric(t, metricsURL, "chatpipe_gateway_backlogs_total") - backlogs
	t.Logf("%v backlogs read back", got)
	if got < 2 {
		t.Errorf("backlogs %v, want at least one per slow device: the pushes were not read back", got)
	}
	if n := stacktest.Metric(t, metricsURL, "chatpipe_gateway_slow_readers_closed_total"); n != 0 {
		t.Errorf("slow readers closed %v, want 0: the devices read", n)
	}
}

// pauseFor is how long a slow device pauses after its nth message: while
// the burst goes on, 2 ms, and 250 ms after every 25th (about 80 messages
// a second, in spurts, as a phone on a weak network reads); afterwards
// 1 ms, to take the rest sooner.
func pauseFor(n int, burst bool) time.Duration {
	switch {
	case !burst:
		return time.Millisecond
	case n%25 == 0:
		return 250 * time.Millisecond
	default:
		return 2 * time.Millisecond
	}
}

// slowDevice is a raw websocket of a user that reads slowly through a small
// socket receive buffer, checking the order of every pushed frame.
type slowDevice struct {
	name  string
	c     *websocket.Conn
	batch bool
	burst atomic.Bool // the burst goes on: the device reads slowly (pauseFor)

	mu      sync.Mutex
	high    map[string]int64 // per conversation, the highest seq so far (every lower one arrived too)
	markers map[string]int64 // the highest read marker so far
	frames  int
	dups    int
	err     error // the first broken rule, or the connection's end
}

// dialSlowDevice connects a device of user with a 64 KB socket receive
// buffer, asking for subprotocols; the test's cleanup closes it.
func dialSlowDevice(ctx context.Context, t *testing.T, dev *devProc, user, name string, subprotocols []string) *slowDevice {
	t.Helper()
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetReadBuffer(64 << 10) // the kernel does not take the burst off the gateway's hands
		}
		return c, err
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(dctx, dev.EP.WebSocket+"?token="+dev.Token(t, user),
		&websocket.DialOptions{Subprotocols: subprotocols, HTTPClient: &http.Client{Transport: &http.Transport{DialContext: dial}}})
	if err != nil {
		t.Fatalf("dial %s device of %s: %v", name, user, err)
	}
	c.SetReadLimit(1 << 20)
	t.Cleanup(func() { c.CloseNow() })
	d := &slowDevice{name: name, c: c, batch: len(subprotocols) > 0, high: map[string]int64{}, markers: map[string]int64{}}
	d.burst.Store(true)
	return d
}

// read reads until ctx ends or a rule breaks, pausing after each message.
func (d *slowDevice) read(ctx context.Context) {
	for n := 1; ; n++ {
		_, msg, err := d.c.Read(ctx)
		if err != nil {
			d.fail(fmt.Errorf("%s device: the connection ended: %w", d.name, err))
			return
		}
		frames := [][]byte{msg}
		if d.batch {
			frames = bytes.Split(msg, []byte("\n"))
		}
		for _, b := range frames {
			if err := d.frame(b); err != nil {
				d.fail(err)
				return
			}
		}
		time.Sleep(pauseFor(n, d.burst.Load()))
	}
}

// frame checks one pushed frame: per conversation, an event arrives for
// the first time only as the next seq (a lower one is a repeat, which
// clients drop), and a read marker never goes back.
func (d *slowDevice) frame(b []byte) error {
	var f frame
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("%s device: bad frame %q: %w", d.name, b, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.frames++
	switch f.Op {
	case protocol.OpEvent:
		switch h := d.high[f.ConversationID]; {
		case f.Seq <= h:
			d.dups++
		case f.Seq == h+1:
			d.high[f.ConversationID] = f.Seq
		default:
			return fmt.Errorf("%s device, conversation %s: seq %d arrived while the highest so far was %d (seqs %d..%d come later or never)",
				d.name, f.ConversationID, f.Seq, h, h+1, f.Seq-1)
		}
	case protocol.OpRead:
		if m := d.markers[f.ConversationID]; f.Seq < m {
			return fmt.Errorf("%s device, conversation %s: read marker %d arrived after marker %d", d.name, f.ConversationID, f.Seq, m)
		}
		d.markers[f.ConversationID] = f.Seq
	default:
		return fmt.Errorf("%s device: unexpected frame %s", d.name, b)
	}
	return nil
}

func (d *slowDevice) fail(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil && !errors.Is(err, context.Canceled) {
		d.err = err
	}
}

// failed returns the first broken rule, or how the connection ended.
func (d *slowDevice) failed() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// behind counts the events of last the device has not received.
func (d *slowDevice) behind(last map[string]int64) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := int64(0)
	for c, seq := range last {
		n += max(seq-d.high[c], 0)
	}
	return n
}

// complete returns "" once every conversation of last has reached its seq
// there, in events and read marker; otherwise where the device stands.
func (d *slowDevice) complete(convs []string, last map[string]int64) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var behind []string
	for _, c := range convs {
		if d.high[c] < last[c] || d.markers[c] < last[c] {
			behind = append(behind, fmt.Sprintf("%s: events to %d, marker %d, of %d", c, d.high[c], d.markers[c], last[c]))
		}
	}
	sort.Strings(behind)
	if len(behind) == 0 {
		return ""
	}
	return fmt.Sprintf("%s device behind (%v)", d.name, behind)
}

func (d *slowDevice) received() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.frames
}

func (d *slowDevice) repeats() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dups
}
