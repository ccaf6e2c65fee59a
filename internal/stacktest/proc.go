package stacktest

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Proc is one role of the stack running as its own OS process.
type Proc struct {
	Name string    // what StartProc was given; the log is <Name>.log
	Log  string    // the path of its log (stdout and stderr)
	Cmd  *exec.Cmd // the running command

	t    testing.TB
	done chan struct{}
}

// StartProc runs the chatpipe binary with args as name, its output
// appended to <name>.log in dir and env added to its environment; t's
// clean-up stops it (Stop).
func StartProc(t testing.TB, dir, name string, env []string, args ...string) *Proc {
	t.Helper()
	binary := Binary(t)
	Watch(t)
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Proc{t: t, Name: name, Cmd: cmd, done: make(chan struct{}), Log: logPath}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() { p.Stop() })
	return p
}

// Done is closed once the process has exited and been waited for.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process; an error fails the test.
func (p *Proc) Signal(sig syscall.Signal) {
	if err := p.Cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v to %s: %v", sig, p.Name, err)
	}
}

// Kill9 kills the process without warning and waits for it.
func (p *Proc) Kill9() {
	p.Cmd.Process.Kill()
	<-p.done
}

// Stop ends the process gracefully (SIGCONT first, in case it is paused,
// then Terminate). Safe twice.
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.Cmd.Process.Signal(syscall.SIGCONT)
	start := time.Now()
	if !Terminate(p.Cmd.Process, p.done, 30*time.Second) {
		p.t.Errorf("%s did not stop within 30 s of SIGTERM; its goroutines at SIGQUIT and log:\n%s", p.Name, TailN(p.Log, 600))
		return
	}
	logSlowStop(p.t, p.Name, time.Since(start))
}

// slowStop is how long a process may take to stop at a test's end before
// the test logs it: a slow shutdown is a cost every test pays.
const slowStop = time.Second

func logSlowStop(t testing.TB, name string, took time.Duration) {
	if took > slowStop {
		t.Logf("%s took %v to stop after SIGTERM", name, took.Round(time.Millisecond))
	}
}

// Terminate sends SIGTERM and waits until done closes; false if it did not
// within: the process then gets SIGQUIT, which makes a Go process print
// every goroutine's stack to its log and exit (what its shutdown waits on),
// and SIGKILL 10 s later.
func Terminate(proc *os.Process, done <-chan struct{}, within time.Duration) bool {
	proc.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return true
	case <-time.After(within):
	}
	proc.Signal(syscall.SIGQUIT)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		proc.Kill()
		<-done
	}
	return false
}
