package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// The websocket floor (-ws): a bare websocket server with the gateway's
// websocket library, one goroutine and one Write per frame per
// connection, no protocol. The writer serves websocket connections; the
// sink dials them (told where by its first line of input, "dial URL N")
// and reads every message, one goroutine per connection, as devices do.

// runWSSink dials the connections its first line names, reads them until
// the writer closes them, and answers each further line of in as
// runSink does. It ends when in closes.
func runWSSink(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	if !sc.Scan() {
		return errors.New("ws sink: no dial line")
	}
	f := strings.Fields(sc.Text())
	if len(f) != 3 || f[0] != "dial" {
		return fmt.Errorf("ws sink: first line %q, want dial URL N", sc.Text())
	}
	n, err := strconv.Atoi(f[2])
	if err != nil || n < 1 {
		return fmt.Errorf("ws sink: bad count %q", f[2])
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var read atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; i < n; i++ {
		c, _, err := websocket.Dial(ctx, f[1], nil)
		if err != nil {
			return fmt.Errorf("ws sink: dial %d: %w", i, err)
		}
		c.SetReadLimit(1 << 20)
		wg.Add(1)
		go func() { // ends when the writer closes the connection or ctx ends
			defer wg.Done()
			defer c.CloseNow()
			for {
				_, b, err := c.Read(ctx)
				read.Add(int64(len(b)))
				if err != nil {
					return
				}
			}
		}()
	}
	fmt.Fprintln(out, "dialed")
	for sc.Scan() {
		u := self()
		fmt.Fprintf(out, "%d %d %d\n", u.cpu.Nanoseconds(), u.switches, read.Load())
	}
	return sc.Err()
}

// runWSWriter serves websocket connections, has the sink dial conns of
// them, writes to them as the websocket floor does and prints the same
// figures as runWriter.
func runWSWriter(out io.Writer, conns, rate, size int, warmup, duration time.Duration) error {
	if conns < 1 || rate < 1 || size < 1 {
		return errors.New("-conns, -rate and -size must be positive")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	accepted := make(chan *websocket.Conn, conns)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		accepted <- c // (the connection outlives the handler: it is hijacked)
	})}
	go srv.Serve(ln) // ends at srv.Close below
	defer srv.Close()

	sk, err := startSink("ws")
	if err != nil {
		return err
	}
	defer sk.close()
	toSink, lines := sk.toSink, sk.lines
	if _, err := fmt.Fprintf(toSink, "dial ws://%s/ %d\n", ln.Addr(), conns); err != nil {
		return fmt.Errorf("ask the sink to dial: %w", err)
	}
	if !lines.Scan() || lines.Text() != "dialed" {
		return fmt.Errorf("sink did not dial: %q", lines.Text())
	}

	// One writer goroutine per connection, fed by a channel, as the
	// gateway's per-device writer is.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	queues := make([]chan []byte, conns)
	var writeErr atomic.Value
	for i := range queues {
		c := <-accepted
		q := make(chan []byte, 64)
		queues[i] = q
		wg.Add(1)
		go func() { // ends when q closes or a write fails
			defer wg.Done()
			defer c.CloseNow()
			for b := range q {
				if err := c.Write(ctx, websocket.MessageText, b); err != nil {
					writeErr.CompareAndSwap(nil, err)
					for range q {
					}
					return
				}
			}
		}()
	}
	stop := func() {
		for _, q := range queues {
			close(q)
		}
		wg.Wait()
		cancel()
	}

	mark := sk.mark

	frame := bytes.Repeat([]byte{'x'}, size)
	start := time.Now()
	writes, next := int64(0), 0
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var w0, s0 usage
	var b0, writes0 int64
	var t0 time.Time
	measuring := false
	for now := range tick.C {
		el := now.Sub(start)
		if !measuring && el >= warmup {
			if s0, b0, err = mark(); err != nil {
				stop()
				return err
			}
			w0, writes0, t0, measuring = self(), writes, time.Now(), true
		}
		if el >= warmup+duration {
			break
		}
		due := int64(el.Seconds() * float64(rate))
		for ; writes < due; writes++ {
			queues[next] <- frame
			next = (next + 1) % conns
		}
	}
	writes1, secs := writes, time.Since(t0).Seconds()
	// The writers and the sink may still be busy with the last frames:
	// wait until the sink has read all it was sent, or a second.
	var s1 usage
	var b1 int64
	for deadline := time.Now().Add(time.Second); ; {
		if s1, b1, err = mark(); err != nil {
			stop()
			return err
		}
		if b1 >= writes1*int64(size) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	w1 := self()
	stop()
	if err, _ := writeErr.Load().(error); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	n := float64(writes1 - writes0)
	nf := float64(b1-b0) / float64(size)
	fmt.Fprintf(out, "floor_writes_per_sec %.0f\n", n/secs)
	fmt.Fprintf(out, "floor_frames_per_write 1\n")
	fmt.Fprintf(out, "floor_writer_us_per_write %.2f\n", float64((w1.cpu-w0.cpu).Microseconds())/n)
	fmt.Fprintf(out, "floor_writer_us_per_frame %.2f\n", float64((w1.cpu-w0.cpu).Microseconds())/n)
	fmt.Fprintf(out, "floor_writer_switches_per_write %.2f\n", float64(w1.switches-w0.switches)/n)
	fmt.Fprintf(out, "floor_sink_us_per_frame %.2f\n", float64((s1.cpu-s0.cpu).Microseconds())/nf)
	fmt.Fprintf(out, "floor_sink_switches_per_frame %.2f\n", float64(s1.switches-s0.switches)/nf)
	fmt.Fprintf(out, "window_secs %.2f\n", secs)
	fmt.Fprintf(out, "conns %d\n", conns)
	fmt.Fprintf(out, "frame_bytes %d\n", size)
	return nil
}
