// Command floor measures what one small write to a loopback TCP socket
// costs on this machine: the floor under the gateway's CPU per websocket
// message, which is at least one write to a device's socket (one event
// frame for a plain device, several joined for a batching one).
//
// One process (the writer) writes frames of -size bytes to -conns
// connections, round robin, paced at -rate frames a second, -batch frames
// per write(2), all from one goroutine: no websocket framing, no
// encoding, no goroutine per connection, no fan-out. A second process (the
// sink: this command, started again with CHATPIPE_FLOOR_SINK set) reads
// them, one goroutine per connection, as the devices would. Both report their CPU (utime + stime, every
// thread) over the measured window, after a warm-up. The gateway does all
// of this and more per event, so what the writer spends per write is a
// lower bound on what the gateway can spend per write.
//
// It prints key value lines:
//
//	floor_writes_per_sec, floor_frames_per_write, floor_writer_us_per_write,
//	floor_writer_us_per_frame, floor_sink_us_per_frame, floor_writer_switches_per_write,
//	floor_sink_switches_per_frame,
//	window_secs, conns, frame_bytes
//
// With -ws it measures a bare websocket server instead (ws.go): the
// gateway's websocket library, one goroutine and one websocket message per
// frame per connection, no protocol; it prints the same keys.
//
// Usage: floor [-ws] [-conns 1200] [-rate 30000] [-batch 1] [-size 300] [-duration 10s]
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// sinkEnv, set in its environment, makes this command the reading side
// (the writer starts it so).
const sinkEnv = "CHATPIPE_FLOOR_SINK"

func main() {
	conns := flag.Int("conns", 1200, "connections (devices)")
	rate := flag.Int("rate", 30000, "frames a second, over all connections")
	batch := flag.Int("batch", 1, "frames per write(2) to one connection")
	size := flag.Int("size", 300, "frame bytes (a typical event frame is ~300)")
	duration := flag.Duration("duration", 10*time.Second, "measured window")
	warmup := flag.Duration("warmup", 2*time.Second, "load before the window")
	ws := flag.Bool("ws", false, "a bare websocket server instead of TCP writes: one goroutine and one websocket message per frame per connection (-batch is ignored)")
	flag.Parse()
	var err error
	switch {
	case os.Getenv(sinkEnv) == "ws":
		err = runWSSink(os.Stdin, os.Stdout)
	case os.Getenv(sinkEnv) != "":
		err = runSink(os.Stdin, os.Stdout)
	case *ws:
		err = runWSWriter(os.Stdout, *conns, *rate, *size, *warmup, *duration)
	default:
		err = runWriter(os.Stdout, *conns, *rate, *batch, *size, *warmup, *duration)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

// usage is this process's CPU time so far and its context switches.
type usage struct {
	cpu      time.Duration
	switches int64
}

func self() usage {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return usage{
		cpu:      time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		switches: ru.Nvcsw + ru.Nivcsw,
	}
}

// runSink listens, prints its address, reads every connection until the
// writer closes it, and on each line of in prints its CPU time (ns), its
// context switches and the bytes read so far. It ends when in closes.
func runSink(in io.Reader, out io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("sink listen: %w", err)
	}
	defer ln.Close()
	fmt.Fprintln(out, ln.Addr().String())
	var read atomic.Int64
	go func() { // ends when ln closes (at return)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // ends at the writer's close
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					read.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		u := self()
		fmt.Fprintf(out, "%d %d %d\n", u.cpu.Nanoseconds(), u.switches, read.Load())
	}
	return sc.Err()
}

// runWriter starts the sink, writes to it as the package documentation
// says and prints the figures to out.
func runWriter(out io.Writer, conns, rate, batch, size int, warmup, duration time.Duration) error {
	if conns < 1 || rate < 1 || batch < 1 || size < 1 {
		return errors.New("-conns, -rate, -batch and -size must be positive")
	}
	sk, err := startSink("1")
	if err != nil {
		return err
	}
	defer sk.close()
	lines := sk.lines
	if !lines.Scan() {
		return errors.New("sink printed no address")
	}
	addr := lines.Text()
	mark := sk.mark

	cs := make([]net.Conn, conns)
	for i := range cs {
		if cs[i], err = net.Dial("tcp", addr); err != nil {
			return fmt.Errorf("dial %d: %w", i, err)
		}
		defer cs[i].Close()
	}
	frames := bytes.Repeat([]byte{'x'}, size*batch)

	// Paced: every millisecond, write what is due since the start.
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
				return err
			}
			w0, writes0, t0, measuring = self(), writes, time.Now(), true
		}
		if el >= warmup+duration {
			break
		}
		due := int64(el.Seconds() * float64(rate) / float64(batch))
		for ; writes < due; writes++ {
			if _, err := cs[next].Write(frames); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			next = (next + 1) % conns
		}
	}
	w1, writes1, secs := self(), writes, time.Since(t0).Seconds()
	s1, b1, err := mark()
	if err != nil {
		return err
	}
	n := float64(writes1 - writes0)
	nf := float64(b1-b0) / float64(size)
	fmt.Fprintf(out, "floor_writes_per_sec %.0f\n", n/secs)
	fmt.Fprintf(out, "floor_frames_per_write %d\n", batch)
	fmt.Fprintf(out, "floor_writer_us_per_write %.2f\n", float64((w1.cpu-w0.cpu).Microseconds())/n)
	fmt.Fprintf(out, "floor_writer_us_per_frame %.2f\n", float64((w1.cpu-w0.cpu).Microseconds())/n/float64(batch))
	fmt.Fprintf(out, "floor_writer_switches_per_write %.2f\n", float64(w1.switches-w0.switches)/n)
	fmt.Fprintf(out, "floor_sink_us_per_frame %.2f\n", float64((s1.cpu-s0.cpu).Microseconds())/nf)
	fmt.Fprintf(out, "floor_sink_switches_per_frame %.2f\n", float64(s1.switches-s0.switches)/nf)
	fmt.Fprintf(out, "window_secs %.2f\n", secs)
	fmt.Fprintf(out, "conns %d\n", conns)
	fmt.Fprintf(out, "frame_bytes %d\n", size)
	return nil
}

// sink is the reading process: the same command, started with sinkEnv
// set to its mode.
type sink struct {
	cmd    *exec.Cmd
	toSink io.WriteCloser
	lines  *bufio.Scanner
}

// startSink starts the sink in mode ("1": TCP, "ws": websocket).
func startSink(mode string) (*sink, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("own executable: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), sinkEnv+"="+mode)
	cmd.Stderr = os.Stderr
	toSink, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("sink stdin: %w", err)
	}
	fromSink, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("sink stdout: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start sink: %w", err)
	}
	return &sink{cmd: cmd, toSink: toSink, lines: bufio.NewScanner(fromSink)}, nil
}

// close ends the sink's input and waits for it to exit.
func (k *sink) close() {
	k.toSink.Close()
	_ = k.cmd.Wait()
}

// mark asks the sink for its CPU time, context switches and bytes read
// so far.
func (k *sink) mark() (usage, int64, error) {
	if _, err := io.WriteString(k.toSink, "mark\n"); err != nil {
		return usage{}, 0, fmt.Errorf("ask the sink: %w", err)
	}
	if !k.lines.Scan() {
		return usage{}, 0, errors.New("sink ended")
	}
	f := strings.Fields(k.lines.Text())
	if len(f) != 3 {
		return usage{}, 0, fmt.Errorf("sink said %q", k.lines.Text())
	}
	ns, _ := strconv.ParseInt(f[0], 10, 64)
	sw, _ := strconv.ParseInt(f[1], 10, 64)
	b, _ := strconv.ParseInt(f[2], 10, 64)
	return usage{cpu: time.Duration(ns), switches: sw}, b, nil
}
