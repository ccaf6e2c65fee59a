package loadgen

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// File names inside a run directory.
const (
	RunFile       = "run.json"
	AcceptedFile  = "accepted.jsonl"
	RejectedFile  = "rejected.jsonl"
	DeliveredFile = "delivered.jsonl"
	ReportJSON    = "report.json"
	ReportMD      = "report.md"
	PhaseFile     = "phase"
	LedgerFile    = "runs.ledger"
	// CountersFile holds the run's live counters (what no record stream
	// holds: first sends, re-sends, errors, the phases' times), rewritten
	// crash-safe every second and at every phase change.
	CountersFile = "counters.json"
	// GaveUpFile lists the commands given up without a final answer (the
	// re-send budget or the attempt limit ran out): their outcome is
	// unknown, so the checker treats them as neither accepted nor rejected.
	GaveUpFile = "gaveup.jsonl"
)

// Stack is how to reach the stack a run drove: what `chatpipe dev` writes
// to endpoints.json. The checker reads the world through it.
type Stack struct {
	WebSocket  string   `json:"websocket"`
	Kafka      []string `json:"kafka"`
	Topic      string   `json:"topic"`
	Postgres   string   `json:"postgres"`
	VShards    int      `json:"vshards"`
	Partitions int      `json:"partitions"`
}

// RunInfo is run.json: the run's settings, the stack and the plan.
type RunInfo struct {
	Run string `json:"run"`
	// Shard is "K/N" for part K of N of a plan; a merged run lists its
	// parts in Parts.
	Shard    string    `json:"shard,omitempty"`
	Parts    []string  `json:"parts,omitempty"`
	Seed     uint64    `json:"seed"`
	Profile  string    `json:"profile"`
	Rate     float64   `json:"rate"`
	Duration string    `json:"duration"`
	Start    time.Time `json:"start"`
	Stack    Stack     `json:"stack"`
	Plan     Plan      `json:"plan"`
}

// Accepted is one line of accepted.jsonl: an `accepted` answer.
type Accepted struct {
	Op              string `json:"op"` // create, send, join, kick, leave
	Conv            string `json:"c"`
	Seq             int64  `json:"s"`
	MessageID       string `json:"m"`
	ClientMessageID string `json:"k,omitempty"`
	Sender          string `json:"u"`
	UserID          string `json:"uid,omitempty"` // join, kick: the user added or removed
	Device          string `json:"d"`
	Due             int64  `json:"t0"` // unix ns: when the schedule wanted it sent
	Sent            int64  `json:"ts"` // unix ns: first attempt written
	At              int64  `json:"ta"` // unix ns: answer received
	Attempts        int    `json:"n"`
	Dup             bool   `json:"dup,omitempty"` // the deliberate second copy of a send
	Probe           bool   `json:"probe,omitempty"`
}

// Rejected is one line of rejected.jsonl: a final (not retried) rejection.
type Rejected struct {
	Op              string `json:"op"`
	Conv            string `json:"c"`
	ClientMessageID string `json:"k,omitempty"`
	Sender          string `json:"u"`
	Code            string `json:"code"`
	Message         string `json:"msg,omitempty"`
	Probe           bool   `json:"probe,omitempty"` // a send by a user just removed: forbidden is expected
}

// Delivered is one line of delivered.jsonl: an `event` frame a device got.
type Delivered struct {
	Device    string `json:"d"`
	Conv      string `json:"c"`
	Seq       int64  `json:"s"`
	Kind      string `json:"kind"`
	MessageID string `json:"m"`
	Sender    string `json:"u"`
	At        int64  `json:"ta"`
}

// GaveUp is one line of gaveup.jsonl: a command given up unanswered.
type GaveUp struct {
	Op              string `json:"op"`
	Conv            string `json:"c"`
	ClientMessageID string `json:"k,omitempty"`
	Sender          string `json:"u"`
	Attempts        int    `json:"n"`
	Why             string `json:"why"` // the re-send refused: budget or attempts
	Probe           bool   `json:"probe,omitempty"`
	Dup             bool   `json:"dup,omitempty"`
	// Sent is when its first attempt was written (unix ns; 0: never, or a
	// run from before the field): a message is sent when its first copy
	// is, whatever became of that copy.
	Sent int64 `json:"ts,omitempty"`
}

// Counters is counters.json: the run's counters that no record stream
// holds. Times are unix ns (0: not reached).
type Counters struct {
	Phase     string `json:"phase"`
	At        int64  `json:"at"`
	SendStart int64  `json:"send_start,omitempty"`
	SendEnd   int64  `json:"send_end,omitempty"`
	// Offered counts messages of the schedule that fell due; Sent those
	// written at least once (first sends); Resends every later attempt of
	// any command; GivenUp commands dropped unanswered.
	Offered  int64            `json:"offered"`
	Sent     int64            `json:"sent"`
	Commands int64            `json:"commands"` // first attempts of every command (sends, creates, churn, syncs)
	Resends  int64            `json:"resends"`
	GivenUp  int64            `json:"given_up"`
	Retries  map[string]int64 `json:"retries,omitempty"` // re-sends by cause
	// Refused counts re-sends the policy refused, by cause (budget,
	// attempts): the command then waits only for a late answer to its
	// latest attempt, and is given up if none comes.
	Refused    map[string]int64 `json:"resends_refused,omitempty"`
	Membership int64            `json:"membership_changes"`
	Errors     int64            `json:"errors"`
	Reconnects int64            `json:"reconnects"`
	Unanswered int64            `json:"unanswered"`
	// SentPerSec is the first sends of each second of the send phase.
	SentPerSec []int64 `json:"sent_per_sec,omitempty"`
}

// RunDir is a run directory read back.
type RunDir struct {
	Dir       string
	Info      RunInfo
	Report    Report
	Accepted  []Accepted
	Rejected  []Rejected
	Delivered []Delivered
	GaveUp    []GaveUp
}

// ReadRun reads a finished run directory. A run without report.json never
// finished and cannot be checked.
func ReadRun(dir string) (*RunDir, error) {
	r := &RunDir{Dir: dir}
	if err := readJSON(filepath.Join(dir, RunFile), &r.Info); err != nil {
		return nil, err
	}
	if err := readJSON(filepath.Join(dir, ReportJSON), &r.Report); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("loadgen: %s has no %s: the run did not finish", dir, ReportJSON)
		}
		return nil, err
	}
	var err error
	if r.Accepted, err = readLines[Accepted](filepath.Join(dir, AcceptedFile)); err != nil {
		return nil, err
	}
	if r.Rejected, err = readLines[Rejected](filepath.Join(dir, RejectedFile)); err != nil {
		return nil, err
	}
	if r.Delivered, err = readLines[Delivered](filepath.Join(dir, DeliveredFile)); err != nil {
		return nil, err
	}
	if r.GaveUp, err = readLines[GaveUp](filepath.Join(dir, GaveUpFile)); err != nil {
		return nil, err
	}
	return r, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("loadgen: decode %s: %w", path, err)
	}
	return nil
}

func readLines[T any](path string) ([]T, error) {
	var out []T
	err := eachLine(path, func(v *T) { out = append(out, *v) })
	return out, err
}

// eachLine decodes every line of a JSON-lines file (none if it does not
// exist). A torn last line — a run killed mid-write — is skipped.
func eachLine[T any](path string, fn func(*T)) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var bad error
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		if bad != nil {
			return bad // a bad line that is not the last one
		}
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			bad = fmt.Errorf("loadgen: %s line %d: %w", path, n, err)
			continue
		}
		fn(&v)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("loadgen: read %s: %w", path, err)
	}
	return nil
}

// countLines counts the non-empty lines of a file (0 if it does not exist).
func countLines(path string) (int64, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("loadgen: %w", err)
	}
	defer f.Close()
	var n int64
	buf := make([]byte, 256<<10)
	last := byte('\n')
	for {
		k, err := f.Read(buf)
		for _, c := range buf[:k] {
			if c == '\n' && last != '\n' {
				n++
			}
			last = c
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("loadgen: read %s: %w", path, err)
		}
	}
	return n, nil // a torn last line (no newline yet) is not counted
}

// stream is an append-only JSON-lines record file shared by goroutines.
type stream struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	buf []byte // scratch, under mu
}

func openStream(path string) (*stream, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	return &stream{f: f, w: bufio.NewWriterSize(f, 256<<10)}, nil
}

func (s *stream) write(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return // the record types always marshal
	}
	s.mu.Lock()
	s.w.Write(b)
	s.w.WriteByte('\n')
	s.mu.Unlock()
}

// writeAccepted and writeDelivered append the hot path's records without
// reflection (the same JSON as write).
func (s *stream) writeAccepted(a *Accepted) {
	s.mu.Lock()
	s.buf = appendAccepted(s.buf[:0], a)
	s.buf = append(s.buf, '\n')
	s.w.Write(s.buf)
	s.mu.Unlock()
}

func (s *stream) writeDelivered(x *Delivered) {
	s.mu.Lock()
	s.buf = appendDelivered(s.buf[:0], x)
	s.buf = append(s.buf, '\n')
	s.w.Write(s.buf)
	s.mu.Unlock()
}

// flush writes what is buffered to the file (not synced): a run killed
// later loses at most what came after.
func (s *stream) flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Flush()
}

// close flushes, syncs and closes the file.
func (s *stream) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.w.Flush()
	if e := s.f.Sync(); err == nil {
		err = e
	}
	if e := s.f.Close(); err == nil {
		err = e
	}
	return err
}
