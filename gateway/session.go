package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/protocol"
)

// A device's websocket session: the upgrade and its token, the read loop
// that admits and answers commands, and the one writer of its frames.

// bearer is the request's token: the Authorization header's bearer
// token, else the token query parameter.
func bearer(r *http.Request) string {
	if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") {
		return strings.TrimPrefix(h, "Bearer ")
	}
	return r.URL.Query().Get("token")
}

func (g *Gateway) serveWS(w http.ResponseWriter, r *http.Request) {
	claims, err := g.cfg.Tokens.Verify(r.Context(), bearer(r))
	user := claims.Subject
	if err != nil {
		g.stats.Unauthorized.Add(1)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	st, ok := g.users.connect(user, time.Now())
	if !ok {
		http.Error(w, "too many connections for this user", http.StatusTooManyRequests)
		return
	}
	defer g.users.disconnect(st, time.Now())
	g.cmu.Lock()
	if g.closing {
		g.cmu.Unlock()
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	g.connWG.Add(1)
	g.cmu.Unlock()
	defer g.connWG.Done()

	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: g.cfg.OriginPatterns,
		Subprotocols: []string{protocol.SubprotocolBatch}})
	if err != nil {
		return
	}
	c.SetReadLimit(int64(g.cfg.Limits.MaxFrameBytes))
	g.cmu.Lock()
	if g.closing {
		// Shutdown began while this connection was being upgraded: it
		// closed the connections it found, and this one was not yet
		// among them.
		g.cmu.Unlock()
		c.Close(websocket.StatusServiceRestart, "server restarting")
		return
	}
	g.conns[c] = struct{}{}
	g.cmu.Unlock()
	g.stats.Connections.Add(1)
	defer func() {
		g.cmu.Lock()
		delete(g.conns, c)
		g.cmu.Unlock()
		g.stats.Connections.Add(-1)
		c.CloseNow()
	}()
	sess := newSession(g, c, user)
	sess.exp, sess.limits = g.deadline(claims), st
	g.users.attach(st, sess)
	defer g.users.detach(st, sess)
	sess.run()
}

// session is one websocket connection of an authenticated user.
type session struct {
	g      *Gateway
	c      *websocket.Conn
	user   string
	exp    time.Time  // the token's expiry and leeway: later commands get unauthorized (refresh moves it)
	limits *userState // the user's rate limiter, shared by their connections
	// out is the send buffer: every frame to the device, written in the
	// order queued (replies, pushes, and a backlog's read-back: backlog.go).
	out chan []byte
	// pushRoom is how full pushes may fill the send buffer: the rest is
	// kept for replies (up to MaxInFlight of them, at most half the buffer).
	pushRoom int
	sem      chan struct{}
	// batch: the client asked for protocol.SubprotocolBatch, so the writer
	// sends everything queued when it wakes as one message of
	// newline-separated frames.
	batch bool
	wbuf  []byte // the writer's reused batch buffer

	pending pendingWrites // accepted writes the read model may lack (ryw.go)
	backlog backlog       // pushes the send buffer had no room for (backlog.go)

	closing atomic.Bool
}

func newSession(g *Gateway, c *websocket.Conn, user string) *session {
	return &session{g: g, c: c, user: user, out: make(chan []byte, g.cfg.SendBuffer), sem: make(chan struct{}, g.cfg.MaxInFlight),
		pushRoom: g.cfg.SendBuffer - min(g.cfg.MaxInFlight, g.cfg.SendBuffer/2), batch: c.Subprotocol() == protocol.SubprotocolBatch,
		backlog: newBacklog()}
}

// writeTimeout bounds the writes of one wake-up of a connection's writer:
// a peer that takes longer to read them is closed.
const writeTimeout = 10 * time.Second

// maxBatchBytes bounds one message of a batching connection (frames past
// it go in the next message).
const maxBatchBytes = 64 << 10

// writeBatch writes first and every frame queued behind it as messages of
// newline-separated frames, each at most maxBatchBytes unless one frame
// alone is larger: one write (and one flush) for many events.
// It returns how many frames and messages it wrote (a queued item may
// already hold several newline-joined frames; a frame holds no raw newline).
func (s *session) writeBatch(first []byte) (frames, msgs int64, err error) {
	buf := append(s.wbuf[:0], first...)
	flush := func() error {
		if err := s.c.Write(noDeadline, websocket.MessageText, buf); err != nil {
			return err
		}
		frames, msgs = frames+int64(bytes.Count(buf, newline))+1, msgs+1
		return nil
	}
	for n := len(s.out); n > 0; n-- {
		b := <-s.out
		s.took()
		if len(buf)+1+len(b) > maxBatchBytes {
			if err := flush(); err != nil {
				return frames, msgs, err
			}
			buf = buf[:0]
		} else {
			buf = append(buf, '\n')
		}
		buf = append(buf, b...)
	}
	s.wbuf = buf
	err = flush()
	return frames, msgs, err
}

var newline = []byte{'\n'}

// noDeadline is the context of a session's reads and writes. The websocket
// library registers a callback on a cancellable context for every frame
// read or written (a lock, an allocation, a removal); instead, the
// session's end and a stalled write's deadline close the connection, which
// ends whatever read or write is in flight.
var noDeadline = context.Background()

// run serves the session until its connection ends: the read loop here,
// beside the writer, the backlog's catch-up and the pinger. The session
// ends (ctx is cancelled, which closes the connection) when the read loop
// returns or the writer or the pinger gives up on the peer; run returns
// once all of them, and every command still running, have.
//
// The session's context is its own, not the request's: once the
// connection is hijacked for the websocket, the request's context no
// longer follows it and ends only when the handler returns, after run.
// The connection's end ends the session instead (the peer's close, a
// failed write or ping, or Shutdown's 1012 close).
func (s *session) run() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The session's end ends the connection: a read or write in flight
	// returns (they run on noDeadline).
	context.AfterFunc(ctx, func() { s.c.CloseNow() })
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.writeLoop(ctx, cancel)
	}()
	wg.Add(1)
	go func() { // reads back the pushes the send buffer had no room for
		defer wg.Done()
		s.catchUp(ctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.pingLoop(ctx, cancel)
	}()
	defer wg.Wait()
	defer cancel()
	s.readLoop(ctx, &wg)
}

// writeLoop is the session's one writer: it writes the send buffer's
// frames in the order queued until ctx ends, or until a write fails,
// which ends the session (cancel).
func (s *session) writeLoop(ctx context.Context, cancel context.CancelFunc) {
	// One deadline for what is queued at each wake-up (at most a
	// buffer's worth): a timer re-armed per wake-up, not one per
	// write. When it fires the connection is done for: it is closed.
	var timedOut atomic.Bool
	deadline := time.AfterFunc(time.Hour, func() { timedOut.Store(true); s.c.CloseNow() })
	deadline.Stop()
	defer deadline.Stop()
	for {
		var b []byte
		select {
		case b = <-s.out:
			s.took()
		case <-ctx.Done():
			return
		}
		deadline.Reset(writeTimeout)
		var err error
		var frames, msgs int64
		if s.batch {
			frames, msgs, err = s.writeBatch(b)
		} else {
			frames, msgs, err = s.writeEach(b)
		}
		deadline.Stop()
		s.g.wsMessages.Add(msgs)
		s.g.wsFrames.Add(frames)
		if err != nil {
			if timedOut.Load() && !s.closing.Swap(true) {
				// The deadline fired: the peer stopped reading (the
				// close frame could not be written either). Whether
				// the reader saw the connection end first and ended
				// the session does not matter.
				s.countSlow()
			}
			cancel()
			return
		}
	}
}

// writeEach writes first and every frame queued behind it, one message
// each (a connection without batching). It returns how many frames and
// messages it wrote: the same count.
func (s *session) writeEach(first []byte) (frames, msgs int64, err error) {
	b := first
	for n := len(s.out); ; n-- {
		if err = s.c.Write(noDeadline, websocket.MessageText, b); err != nil {
			break
		}
		frames++
		if n == 0 {
			break
		}
		b = <-s.out
		s.took()
	}
	return frames, frames, err
}

// pingLoop is the session's liveness check: a peer that does not answer a
// ping within PingInterval is closed, and the session ends (cancel).
func (s *session) pingLoop(ctx context.Context, cancel context.CancelFunc) {
	t := time.NewTicker(s.g.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			pctx, pcancel := context.WithTimeout(ctx, s.g.cfg.PingInterval)
			err := s.c.Ping(pctx)
			pcancel()
			if err != nil {
				s.c.Close(websocket.StatusPolicyViolation, "ping timeout")
				cancel()
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// readLoop reads the device's frames until the connection ends. A refresh
// is answered before the next frame is read; a frame that does not decode,
// or a command the session does not admit, is refused; every other command
// runs on a goroutine of its own (wg), at most MaxInFlight at once.
func (s *session) readLoop(ctx context.Context, wg *sync.WaitGroup) {
	for {
		typ, frame, err := s.c.Read(noDeadline)
		if err != nil {
			return
		}
		start := time.Now()
		var (
			req  *protocol.Request
			id   string
			perr *protocol.Error
		)
		if typ != websocket.MessageText {
			perr = protocol.Errorf(protocol.CodeBadRequest, "frames must be text")
		} else if req, id, perr = protocol.Decode(frame, s.g.cfg.Limits); perr == nil && req.Op == protocol.OpRefresh {
			// Handled here, before the next frame is read: the commands
			// that follow a refresh run on the token it installed.
			s.refresh(ctx, req, start)
			continue
		} else if perr == nil {
			perr = s.admit(start)
		}
		if perr != nil {
			s.refuse(req, id, perr, start)
			continue
		}
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-s.sem }()
			s.execute(ctx, req, start)
		}()
	}
}

// refuse answers a frame refused before any writer saw it (it does not
// decode, its token expired, or the user is over the rate limit) with
// perr, counted under req's op.
func (s *session) refuse(req *protocol.Request, id string, perr *protocol.Error, start time.Time) {
	s.g.stats.Rejected.Add(1)
	op := s.g.opLabel(req)
	s.g.count(op, perr.Code)
	s.send(protocol.Rejected(id, perr))
	s.g.observe(op, start)
}

// execute runs an admitted command and answers it: sync, history and
// conversations from the read model, every other op through its writer
// (g.handle, which counts it).
func (s *session) execute(ctx context.Context, req *protocol.Request, start time.Time) {
	op := s.g.opLabel(req)
	var (
		code     protocol.Code
		answered bool
	)
	switch req.Op {
	case protocol.OpSync:
		code, answered = s.sync(ctx, req)
	case protocol.OpHistory:
		code, answered = s.history(ctx, req)
	case protocol.OpConversations:
		code, answered = s.conversations(ctx, req)
	default:
		rep := s.g.handle(ctx, s.user, req) // counts it
		if req.Op != protocol.OpRead {      // a marker names a seq already in the read model
			s.wrote(ctx, rep) // before the client can see it: its next read waits for it
		}
		s.send(rep)
		s.g.observe(op, start)
		return
	}
	if answered { // not when the connection went away first
		s.g.count(op, code)
		s.g.observe(op, start)
	}
}

// deadline is when a connection authenticated by claims stops taking
// commands: the token's exp plus the leeway its verification allowed.
func (g *Gateway) deadline(claims auth.Claims) time.Time {
	return claims.ExpiresAt.Add(g.cfg.Tokens.Leeway())
}

// refresh answers a refresh: a valid token of the connection's user
// replaces the connection's token (its expiry); any other answer changes
// nothing. It costs a command of the user's rate limit, and works on a
// connection whose token has already expired (the new token proves the
// user as an upgrade would).
func (s *session) refresh(ctx context.Context, req *protocol.Request, start time.Time) {
	var (
		perr   *protocol.Error
		claims auth.Claims
		err    error
	)
	if wait, ok := s.limits.allow(start); !ok {
		perr = protocol.Errorf(protocol.CodeRateLimited, "more than %g commands/s from %s", s.g.cfg.UserRate, s.user)
		perr.RetryAfterMS = max(wait.Milliseconds(), 1)
	} else if claims, err = s.g.cfg.Tokens.Verify(ctx, req.Token); err != nil {
		perr = protocol.Errorf(protocol.CodeUnauthorized, "the new token is not valid; the connection keeps its token")
	} else if claims.Subject != s.user {
		perr = protocol.Errorf(protocol.CodeForbidden, "the new token is for another user; the connection keeps its token")
	}
	if perr != nil {
		s.g.stats.Rejected.Add(1)
		s.g.count(protocol.OpRefresh, perr.Code)
		s.send(protocol.Rejected(req.ID, perr))
		s.g.observe(protocol.OpRefresh, start)
		return
	}
	s.exp = s.g.deadline(claims)
	s.g.stats.Accepted.Add(1)
	s.g.count(protocol.OpRefresh, "")
	s.send(&protocol.Reply{Op: protocol.OpAccepted, ID: req.ID, ExpiresAt: protocol.FormatTime(claims.ExpiresAt)})
	s.g.observe(protocol.OpRefresh, start)
}

// admit checks the token is still valid and takes a token from the user's
// bucket: over the limit, the command is answered rate_limited before it
// reaches any writer.
func (s *session) admit(now time.Time) *protocol.Error {
	if now.After(s.exp) {
		return protocol.Errorf(protocol.CodeUnauthorized, "the token expired; refresh it or reconnect with a new one")
	}
	if wait, ok := s.limits.allow(now); !ok {
		e := protocol.Errorf(protocol.CodeRateLimited, "more than %g commands/s from %s", s.g.cfg.UserRate, s.user)
		e.RetryAfterMS = max(wait.Milliseconds(), 1)
		return e
	}
	return nil
}

// send queues a frame; a connection whose buffer is full is a slow reader:
// it is closed with 1008 and catches up with sync.
func (s *session) send(r any) {
	if rep, ok := r.(*protocol.Reply); ok { // every command's answer: encoded by hand
		s.sendRaw(protocol.AppendReply(make([]byte, 0, 192), rep))
		return
	}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	s.sendRaw(b)
}

// sendRaw queues an encoded frame without blocking (see send).
func (s *session) sendRaw(b []byte) {
	select {
	case s.out <- b:
	default:
		s.closeOnce(websocket.StatusPolicyViolation, "send buffer overflow; reconnect and sync")
	}
}

// closeOnce closes the connection (in the background: the close handshake
// waits for the peer) the first time it is called.
func (s *session) closeOnce(code websocket.StatusCode, reason string) {
	if s.closing.Swap(true) {
		return
	}
	if code == websocket.StatusPolicyViolation {
		s.countSlow()
	}
	go s.c.Close(code, reason)
}

// countSlow counts and logs a connection closed for not reading.
func (s *session) countSlow() {
	s.g.slowClosed.Add(1)
	s.g.cfg.Log.Warn("closing a slow websocket reader", "user", s.user)
}
