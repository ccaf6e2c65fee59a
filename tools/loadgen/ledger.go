package loadgen

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Ledger statuses.
const (
	StatusStarted  = "started"
	StatusFinished = "finished"
	StatusFailed   = "failed"
	StatusDied     = "died" // started and never ended: noted by the next run of that name
)

// ErrRunFinished is returned by BeginRun when the ledger already holds a
// finished run of that name: a run name is used once.
var ErrRunFinished = errors.New("loadgen: a run of this name already finished")

// LedgerLine is one line of runs.ledger.
type LedgerLine struct {
	Run    string     `json:"run"`
	Status string     `json:"status"`
	Start  time.Time  `json:"start"`
	End    *time.Time `json:"end,omitempty"`
	Phase  string     `json:"phase,omitempty"` // where a failed or dead run stopped
	Error  string     `json:"error,omitempty"`
}

// ReadLedger returns the ledger's lines (none if it does not exist).
func ReadLedger(path string) ([]LedgerLine, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	var out []LedgerLine
	for _, s := range strings.Split(string(b), "\n") {
		var l LedgerLine
		if s != "" && json.Unmarshal([]byte(s), &l) == nil {
			out = append(out, l)
		}
	}
	return out, nil
}

// BeginRun records the start of run in the ledger. A finished run of that
// name makes it return ErrRunFinished and append nothing; an earlier
// attempt that started and never ended is first recorded as died, with the
// phase it had reached (read from its run directory).
func BeginRun(ledger, run, runDir string, now time.Time) error {
	lines, err := ReadLedger(ledger)
	if err != nil {
		return err
	}
	var last *LedgerLine
	for i := range lines {
		if lines[i].Run != run {
			continue
		}
		if lines[i].Status == StatusFinished {
			return fmt.Errorf("%w: %s (pick another --run)", ErrRunFinished, run)
		}
		last = &lines[i]
	}
	if last != nil && last.Status == StatusStarted {
		phase, _ := os.ReadFile(filepath.Join(runDir, PhaseFile))
		end := now.UTC()
		if err := appendLine(ledger, LedgerLine{Run: run, Status: StatusDied, Start: last.Start, End: &end, Phase: strings.TrimSpace(string(phase))}); err != nil {
			return err
		}
	}
	return appendLine(ledger, LedgerLine{Run: run, Status: StatusStarted, Start: now.UTC()})
}

// EndRun records how run ended (StatusFinished or StatusFailed). It
// appends nothing if the ledger already holds a finished line for run.
func EndRun(ledger string, l LedgerLine) error {
	lines, err := ReadLedger(ledger)
	if err != nil {
		return err
	}
	for _, x := range lines {
		if x.Run == l.Run && x.Status == StatusFinished {
			return nil
		}
	}
	return appendLine(ledger, l)
}

// appendLine appends one JSON line and syncs the file.
func appendLine(path string, l LedgerLine) error {
	b, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("loadgen: append to %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("loadgen: sync %s: %w", path, err)
	}
	return f.Close()
}
