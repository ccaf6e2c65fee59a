package testdeadline

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestHangEndsTheBinaryNamingTheWait runs a hanging test in a child test
// binary and checks that it ends at the test's own deadline, long before
// the child's -timeout, saying which test and which wait.
func TestHangEndsTheBinaryNamingTheWait(t *testing.T) {
	if os.Getenv("TESTDEADLINE_CHILD") == "1" {
		AtExit(func() { println("the clean-up ran") })
		w := For(t, 300*time.Millisecond)
		w.Waiting("the finished wait")()
		done := w.Waiting("conversation c1 at seq 42 in Postgres")
		defer done()
		time.Sleep(time.Minute)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestHangEndsTheBinaryNamingTheWait$", "-test.timeout", "10m")
	cmd.Env = append(os.Environ(), "TESTDEADLINE_CHILD=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 {
		t.Fatalf("child ended with %v after %v, want exit status 2; its output:\n%s", err, took, out.String())
	}
	if took > 30*time.Second {
		t.Errorf("child ran %v: its 300ms deadline did not end it", took)
	}
	got := out.String()
	for _, want := range []string{
		"TestHangEndsTheBinaryNamingTheWait ran past its own deadline of 300ms",
		"for conversation c1 at seq 42 in Postgres",
		"goroutine",
		"the clean-up ran",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "the finished wait") {
		t.Errorf("output names a wait that ended:\n%s", got)
	}
}

// TestDisarmedWhenTheTestEnds: a watch of a test that ended does not fire,
// and For on a new test arms a new one.
func TestDisarmedWhenTheTestEnds(t *testing.T) {
	fired := make(chan string, 4)
	old := expire
	expire = func(w *Watch) { fired <- w.name }
	t.Cleanup(func() { expire = old })

	var first *Watch
	t.Run("short", func(t *testing.T) {
		first = For(t, 100*time.Millisecond)
		if For(t, time.Hour) != first {
			t.Fatal("a second For of one test gave another watch")
		}
	})
	t.Run("hangs", func(t *testing.T) {
		if w := For(t, 100*time.Millisecond); w == first {
			t.Fatal("a new test got the ended test's watch")
		}
		select {
		case name := <-fired:
			if !strings.HasSuffix(name, "/hangs") {
				t.Errorf("fired for %s", name)
			}
		case <-time.After(10 * time.Second):
			t.Error("the deadline did not fire")
		}
	})
	select {
	case name := <-fired:
		t.Errorf("fired again, for %s", name)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestExtend moves a deadline later, never earlier.
func TestExtend(t *testing.T) {
	fired := make(chan time.Time, 1)
	old := expire
	expire = func(*Watch) { fired <- time.Now() }
	t.Cleanup(func() { expire = old })

	t.Run("later", func(t *testing.T) {
		w := For(t, 50*time.Millisecond)
		w.Extend(400 * time.Millisecond)
		w.Extend(10 * time.Millisecond)
		select {
		case at := <-fired:
			if d := at.Sub(w.started); d < 400*time.Millisecond {
				t.Errorf("fired %v after the start, before the extended 400ms", d)
			}
		case <-time.After(10 * time.Second):
			t.Error("the extended deadline did not fire")
		}
	})
}

// TestNotArmedAfterTheTest: a goroutine that outlives its test and asks
// for the test's watch gets one that never fires.
func TestNotArmedAfterTheTest(t *testing.T) {
	fired := make(chan string, 1)
	old := expire
	expire = func(w *Watch) { fired <- w.name }
	t.Cleanup(func() { expire = old })

	var ended testing.TB
	t.Run("ends", func(t *testing.T) { ended = t })
	w := For(ended, 50*time.Millisecond)
	w.Extend(100 * time.Millisecond)
	w.Waiting("something after the end")()
	select {
	case name := <-fired:
		t.Errorf("a watch asked for after %s ended fired", name)
	case <-time.After(400 * time.Millisecond):
	}
}
