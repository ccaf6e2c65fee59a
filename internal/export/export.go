// Package export is the nightly job a data team schedules: it writes one
// day's committed events to chunk files, crash-safe
// (docs/operations.md, "Nightly export").
//
//   - The day's events are ordered by (conversation_id, seq) and split into
//     chunks of a fixed size, so a chunk's content depends only on the day.
//   - Each chunk is written to a temp name beside its target, synced and
//     renamed into place: a finished chunk file is the chunk's marker, and no
//     partial file is ever visible under a final name.
//   - A run is recorded in an append-only run ledger (run name, start, end,
//     status, the chunk where it died). A run started again with the same
//     name skips the finished chunks and removes the dead run's temp files.
//     Two runs must not write the same day at once.
//   - The day's totals are recomputed from the chunk files, not from what
//     this run did, and appended to the daily ledger once per run name.
package export

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Config configures one run.
type Config struct {
	DB        *pgxpool.Pool
	Day       time.Time // UTC day
	Out       string    // output directory
	Run       string    // run name (default export-<day>)
	ChunkSize int       // events per chunk (default 1000)
	// BeforeRename, if set, is called with each chunk's temp file written
	// but not yet renamed (tests kill the process there).
	BeforeRename func(chunk int)
}

// Totals are the day's figures, recomputed from the chunk files.
type Totals struct {
	Day           string `json:"day"`
	Chunks        int    `json:"chunks"`
	Events        int64  `json:"events"`
	Messages      int64  `json:"messages"`
	Conversations int64  `json:"conversations"`
}

// ledgerLine is one line of the run ledger.
type ledgerLine struct {
	Run    string    `json:"run"`
	Status string    `json:"status"` // started, finished, failed, died
	At     time.Time `json:"at"`
	Chunk  *int      `json:"chunk,omitempty"` // where it failed or died
	Error  string    `json:"error,omitempty"`
}

// Run exports the day. It is safe to run again after a crash.
func Run(ctx context.Context, cfg Config) (Totals, error) {
	day := cfg.Day.UTC().Format("2006-01-02")
	if cfg.Run == "" {
		cfg.Run = "export-" + day
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = 1000
	}
	dir := filepath.Join(cfg.Out, day)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Totals{}, fmt.Errorf("export: %w", err)
	}
	runLedger := filepath.Join(cfg.Out, "runs.ledger")
	if err := noteDeadRuns(runLedger, cfg.Run, dir); err != nil {
		return Totals{}, err
	}
	// A run killed between writing a chunk and renaming it leaves its temp
	// file; it never had a final name, so it is only clutter now.
	stale, _ := filepath.Glob(filepath.Join(dir, ".chunk-*.jsonl.tmp-*"))
	for _, f := range stale {
		if err := os.Remove(f); err != nil {
			return Totals{}, fmt.Errorf("export: remove a dead run's temp file: %w", err)
		}
	}
	if err := appendJSON(runLedger, ledgerLine{Run: cfg.Run, Status: "started", At: time.Now().UTC()}); err != nil {
		return Totals{}, err
	}
	chunk, err := writeChunks(ctx, cfg, dir)
	if err != nil {
		_ = appendJSON(runLedger, ledgerLine{Run: cfg.Run, Status: "failed", At: time.Now().UTC(), Chunk: &chunk, Error: err.Error()})
		return Totals{}, err
	}
	t, err := recount(dir, day)
	if err != nil {
		return Totals{}, err
	}
	b, _ := json.MarshalIndent(t, "", "  ")
	if err := writeAtomic(filepath.Join(dir, "totals.json"), append(b, '\n')); err != nil {
		return Totals{}, err
	}
	if err := appendDailyOnce(filepath.Join(cfg.Out, "daily.ledger"), cfg.Run, t); err != nil {
		return Totals{}, err
	}
	return t, appendJSON(runLedger, ledgerLine{Run: cfg.Run, Status: "finished", At: time.Now().UTC()})
}

func chunkName(dir string, k int) string {
	return filepath.Join(dir, fmt.Sprintf("chunk-%05d.jsonl", k))
}

// writeChunks writes every chunk not finished yet; on error it returns the
// chunk it was writing.
func writeChunks(ctx context.Context, cfg Config, dir string) (int, error) {
	from := cfg.Day.UTC().Truncate(24 * time.Hour)
	rows, err := cfg.DB.Query(ctx, `SELECT row_to_json(e)::text FROM (
		SELECT conversation_id, seq, kind, message_id, client_message_id, sender, body, user_id, members, created_at
		FROM events WHERE created_at >= $1 AND created_at < $2 ORDER BY conversation_id, seq) e`, from, from.Add(24*time.Hour))
	if err != nil {
		return 0, fmt.Errorf("export: query: %w", err)
	}
	defer rows.Close()
	k, n := 0, 0
	var buf []string
	flush := func() error {
		target := chunkName(dir, k)
		// A chunk finished by an earlier run is skipped: its file is its marker.
		if _, err := os.Stat(target); err != nil {
			err := writeChunk(target, buf, func() {
				if cfg.BeforeRename != nil {
					cfg.BeforeRename(k)
				}
			})
			if err != nil {
				return err
			}
		}
		buf, n = buf[:0], 0
		k++
		return nil
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return k, fmt.Errorf("export: scan: %w", err)
		}
		buf = append(buf, line)
		n++
		if n == cfg.ChunkSize {
			if err := flush(); err != nil {
				return k, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return k, fmt.Errorf("export: read: %w", err)
	}
	if n > 0 {
		if err := flush(); err != nil {
			return k, err
		}
	}
	return k, nil
}

func writeChunk(target string, lines []string, beforeRename func()) error {
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".tmp-*")
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer os.Remove(f.Name())
	w := bufio.NewWriter(f)
	for _, l := range lines {
		w.WriteString(l)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("export: write %s: %w", target, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("export: sync %s: %w", target, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	beforeRename()
	if err := os.Rename(f.Name(), target); err != nil {
		return fmt.Errorf("export: rename %s: %w", target, err)
	}
	return syncDir(filepath.Dir(target))
}

// recount computes the day's totals from the chunk files alone.
func recount(dir, day string) (Totals, error) {
	names, err := filepath.Glob(filepath.Join(dir, "chunk-*.jsonl"))
	if err != nil {
		return Totals{}, err
	}
	sort.Strings(names)
	t := Totals{Day: day, Chunks: len(names)}
	convs := map[string]bool{}
	for _, name := range names {
		f, err := os.Open(name)
		if err != nil {
			return Totals{}, fmt.Errorf("export: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e struct {
				ConversationID string `json:"conversation_id"`
				Kind           string `json:"kind"`
			}
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				f.Close()
				return Totals{}, fmt.Errorf("export: %s: %w", name, err)
			}
			t.Events++
			if e.Kind == "message" {
				t.Messages++
			}
			convs[e.ConversationID] = true
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return Totals{}, fmt.Errorf("export: %s: %w", name, err)
		}
	}
	t.Conversations = int64(len(convs))
	return t, nil
}

// noteDeadRuns records, for an earlier run of this name that started and
// never ended, that it died and at which chunk (the first one missing).
func noteDeadRuns(ledger, run, dir string) error {
	lines, err := readLedger(ledger)
	if err != nil {
		return err
	}
	open := false
	for _, l := range lines {
		if l.Run != run {
			continue
		}
		open = l.Status == "started"
	}
	if !open {
		return nil
	}
	k := 0
	for {
		if _, err := os.Stat(chunkName(dir, k)); err != nil {
			break
		}
		k++
	}
	return appendJSON(ledger, ledgerLine{Run: run, Status: "died", At: time.Now().UTC(), Chunk: &k})
}

func readLedger(path string) ([]ledgerLine, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	var out []ledgerLine
	for _, s := range strings.Split(string(b), "\n") {
		var l ledgerLine
		if s != "" && json.Unmarshal([]byte(s), &l) == nil {
			out = append(out, l)
		}
	}
	return out, nil
}

// appendDailyOnce appends the day's totals unless this run name has already.
func appendDailyOnce(path, run string, t Totals) error {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("export: %w", err)
	}
	for _, s := range strings.Split(string(b), "\n") {
		var l struct {
			Run string `json:"run"`
		}
		if s != "" && json.Unmarshal([]byte(s), &l) == nil && l.Run == run {
			return nil
		}
	}
	return appendJSON(path, struct {
		Run string `json:"run"`
		Totals
	}{run, t})
}

// appendJSON appends one JSON line and syncs it.
func appendJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("export: append %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("export: sync %s: %w", path, err)
	}
	return f.Close()
}

func writeAtomic(path string, b []byte) error {
	return writeChunk(path, []string{strings.TrimSuffix(string(b), "\n")}, func() {})
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
