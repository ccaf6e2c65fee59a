package devstack

import (
	"errors"
	"log/slog"
	"net"
	"syscall"
	"testing"
)

// scriptedListener returns its errors in turn, then a connection, then
// net.ErrClosed.
type scriptedListener struct {
	net.Listener
	errs  []error
	conns []net.Conn
}

func (l *scriptedListener) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, err
	}
	if len(l.conns) > 0 {
		c := l.conns[0]
		l.conns = l.conns[1:]
		return c, nil
	}
	return nil, net.ErrClosed
}

// TestSteadyListenerOutlivesPassingErrors: the broker's listener keeps
// accepting after running out of file descriptors (kfake's own loop would
// have returned and closed it), and still ends when the listener is closed.
func TestSteadyListenerOutlivesPassingErrors(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	l := steadyListener{Listener: &scriptedListener{
		errs:  []error{&net.OpError{Op: "accept", Err: syscall.EMFILE}, &net.OpError{Op: "accept", Err: syscall.ECONNABORTED}},
		conns: []net.Conn{a},
	}, log: slog.New(slog.DiscardHandler)}
	c, err := l.Accept()
	if err != nil || c != a {
		t.Fatalf("Accept after EMFILE and ECONNABORTED = %v, %v; want the connection", c, err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on a closed listener = %v, want net.ErrClosed", err)
	}
}
