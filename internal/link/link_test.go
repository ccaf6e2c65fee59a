package link

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

// echo answers every command accepted, with its id.
func echo(req *Request, reply func(*Response)) {
	reply(&Response{RID: req.RID, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: req.Req.ID}})
}

// endsWithin reports whether c's peer closes it within d (EOF, or a reset
// for a peer that closed with data unread), reading whatever comes before.
func endsWithin(c net.Conn, d time.Duration) error {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	return err
}

// A worker closes a link on which it reads a line that is not a request:
// not JSON, a request without a command, or longer than a line may be.
// A good line is answered and the link stays.
func TestBadRequestLinesCloseTheLink(t *testing.T) {
	addr := serve(t, echo, Config{})
	for name, line := range map[string]string{
		"not json":        "hello\n",
		"no command":      `{"rid":1,"user":"u1"}` + "\n",
		"wrong type":      `{"rid":"one","req":{"op":"send","id":"r1"}}` + "\n",
		"over maxLine":    `{"rid":1,"req":{"op":"send","id":"r1","body":"` + strings.Repeat("x", maxLine) + `"}}` + "\n",
		"unfinished json": `{"rid":1,"req":{"op":"send"` + "\n",
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		go c.Write([]byte(line))
		if err := endsWithin(c, 5*time.Second); err != nil {
			t.Fatalf("%s: link not closed: %v", name, err)
		}
		c.Close()
	}

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte(`{"rid":5,"user":"u1","req":{"op":"send","id":"r5"}}` + "\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadBytes('\n')
	var resp Response
	if err != nil || json.Unmarshal(line, &resp) != nil || resp.RID != 5 || resp.Reply.ID != "r5" {
		t.Fatalf("good line: %q %v", line, err)
	}
	if err := endsWithin(c, 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the link of a good line ended: %v", err)
	}
}

// rawWorker accepts links and hands each to serve, as a worker speaking
// the protocol by hand.
func rawWorker(t *testing.T, serve func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); serve(c) }()
		}
	}()
	return ln.Addr().String()
}

// requests reads c's request lines, answering pings, and passes on the
// others.
func requests(c net.Conn, reqs chan<- *Request) {
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		var r Request
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			return
		}
		if r.Ping {
			b, _ := json.Marshal(&Response{RID: r.RID, Pong: true})
			c.Write(append(b, '\n'))
			continue
		}
		reqs <- &r
	}
}

func answerLine(rid uint64, id string) []byte {
	b, _ := json.Marshal(&Response{RID: rid, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: id}})
	return append(b, '\n')
}

// Many calls are in flight on one link at once, and each gets its own
// answer whatever order the worker answers in.
func TestPipelinedCallsAreMatchedByRequestID(t *testing.T) {
	const n = 20
	var mu sync.Mutex
	var held []func()
	all := make(chan struct{})
	addr := serve(t, func(req *Request, reply func(*Response)) {
		mu.Lock()
		defer mu.Unlock()
		r := &Response{RID: req.RID, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: req.Req.ID, Message: req.User}}
		held = append(held, func() { reply(r) })
		if len(held) == n {
			close(all)
		}
	}, Config{})
	cl, err := Dial(context.Background(), addr, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	errs := make(chan error, n)
	for i := range n {
		go func() {
			id, user := fmt.Sprintf("r%d", i), fmt.Sprintf("u%d", i)
			resp, err := cl.Do(context.Background(), user, &protocol.Request{Op: protocol.OpSend, ID: id})
			switch {
			case err != nil:
				errs <- err
			case resp.Reply.ID != id || resp.Reply.Message != user:
				errs <- fmt.Errorf("call %s of %s got the answer to %s of %s", id, user, resp.Reply.ID, resp.Reply.Message)
			default:
				errs <- nil
			}
		}()
	}
	select {
	case <-all: // every call is written before any is answered
	case <-time.After(5 * time.Second):
		t.Fatal("the calls were not all in flight at once")
	}
	mu.Lock()
	for i := len(held) - 1; i >= 0; i-- { // the last first
		held[i]()
	}
	mu.Unlock()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// An answer whose request id no call is waiting for is dropped; the link
// and the call waiting for its own answer go on.
func TestAnswerForAnUnknownRequestIsDropped(t *testing.T) {
	addr := rawWorker(t, func(c net.Conn) {
		reqs := make(chan *Request, 4)
		go requests(c, reqs)
		for r := range reqs {
			c.Write(answerLine(r.RID+1000, "stray"))
			c.Write(answerLine(r.RID, r.Req.ID))
		}
	})
	cl, err := Dial(context.Background(), addr, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, id := range []string{"r1", "r2"} {
		resp, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: id})
		if err != nil || resp.Reply.ID != id {
			t.Fatalf("call %s: %+v %v", id, resp, err)
		}
	}
	select {
	case <-cl.Done():
		t.Fatal("a stray answer closed the link")
	default:
	}
}

// A line from the worker that is not a response closes the link: the call
// waiting on it has an unknown outcome (ErrClosed, not ErrNotSent).
func TestBadResponseLineClosesTheLink(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	addr := rawWorker(t, func(c net.Conn) {
		reqs := make(chan *Request, 1)
		go requests(c, reqs)
		<-reqs
		c.Write([]byte("{\"rid\":1,\"reply\":\n"))
		<-stop // keep the connection: only the bad line may close it
	})
	cl, err := Dial(context.Background(), addr, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1"})
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) || errors.Is(err, ErrNotSent) {
			t.Fatalf("call answered with a bad line: %v, want ErrClosed (outcome unknown)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call still waits after a bad line")
	}
	select {
	case <-cl.Done():
	default:
		t.Fatal("the link stays open after a bad line")
	}
}

// A call whose context ends while it waits returns the context's error
// (the command was sent: outcome unknown) and keeps its in-flight slot
// until the worker answers it; the late answer then frees the slot and
// reaches no other call.
func TestAbandonedCallHoldsItsSlotUntilAnswered(t *testing.T) {
	reqs := make(chan *Request, 4)
	conns := make(chan net.Conn, 1)
	addr := rawWorker(t, func(c net.Conn) {
		conns <- c
		requests(c, reqs)
	})
	cl, err := Dial(context.Background(), addr, Config{MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c := <-conns

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = cl.Do(ctx, "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1"})
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrNotSent) {
		t.Fatalf("abandoned call: %v, want the context's error, not ErrNotSent", err)
	}
	first := <-reqs

	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	if _, err := cl.Do(ctx2, "u1", &protocol.Request{Op: protocol.OpSend, ID: "r2"}); !errors.Is(err, ErrNotSent) {
		t.Fatalf("call with the only slot held: %v, want ErrNotSent", err)
	}

	c.Write(answerLine(first.RID, first.Req.ID)) // the late answer frees the slot
	done := make(chan error, 1)
	go func() {
		resp, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r3"})
		if err == nil && resp.Reply.ID != "r3" {
			err = fmt.Errorf("call r3 got the answer to %s", resp.Reply.ID)
		}
		done <- err
	}()
	select {
	case r := <-reqs:
		c.Write(answerLine(r.RID, r.Req.ID))
	case <-time.After(5 * time.Second):
		t.Fatal("the late answer did not free the slot")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A request the worker does not take in (it reads nothing) fails at the
// client's write deadline and closes the link.
func TestClientWriteDeadlineClosesAStuckLink(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	addr := rawWorker(t, func(c net.Conn) { <-stop }) // never reads
	cfg := Config{WriteTimeout: 200 * time.Millisecond, ReadTimeout: time.Minute, PingInterval: time.Minute}
	cl, err := Dial(context.Background(), addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	big := strings.Repeat("x", 16<<20) // more than the socket buffers hold
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1", Body: big})
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("stuck write: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the stuck write still waits after 5s, write timeout %v", cfg.WriteTimeout)
	}
	select {
	case <-cl.Done():
	default:
		t.Fatal("the link is still open after a write past its deadline")
	}
}

// Close ends a waiting call as an unknown outcome; later calls are not
// sent.
func TestCloseEndsWaitingCalls(t *testing.T) {
	got := make(chan struct{}, 1)
	addr := serve(t, func(req *Request, reply func(*Response)) { got <- struct{}{} }, Config{}) // never answers
	cl, err := Dial(context.Background(), addr, Config{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1"})
		errc <- err
	}()
	<-got
	cl.Close()
	cl.Close() // twice is safe
	if err := <-errc; !errors.Is(err, ErrClosed) || errors.Is(err, ErrNotSent) {
		t.Fatalf("waiting call after Close: %v, want ErrClosed", err)
	}
	if _, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r2"}); !errors.Is(err, ErrNotSent) {
		t.Fatalf("call after Close: %v, want ErrNotSent", err)
	}
}

// Serve returns nil when its context ends, closing its links.
func TestServeClosesLinksWhenItsContextEnds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, ln, echo, Config{}, quiet()) }()
	cl, err := Dial(context.Background(), ln.Addr().String(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1"}); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v, want nil after its context ended", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	select {
	case <-cl.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the client's link stayed open after Serve ended")
	}
}
