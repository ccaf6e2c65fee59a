package loadgen

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/chatpipe/chatpipe/internal/atomicfile"
)

// MergeLatency merges latency summaries by their HDR histograms (a summary
// with a count and no histogram cannot be merged).
func MergeLatency(ls ...Latency) (Latency, error) {
	h := newHist()
	for _, l := range ls {
		if l.Count == 0 {
			continue
		}
		if l.HDR == "" {
			return Latency{}, errors.New("loadgen: a latency summary without its histogram")
		}
		x, err := hdrhistogram.Decode([]byte(l.HDR))
		if err != nil {
			return Latency{}, fmt.Errorf("loadgen: decode histogram: %w", err)
		}
		h.Merge(x)
	}
	return summarize(h), nil
}

// part is one run directory being merged.
type part struct {
	dir      string
	info     RunInfo
	rep      Report
	counters Counters
}

// Merge combines run directories — typically the shards of one plan, run
// by several loadgen processes against one stack — into the run directory
// out, which `check` then checks as one run: the record streams are
// concatenated, the plans joined, the counters added up (the timeline
// aligned on the wall clock), the latency histograms merged, and one
// report written. The merged run finished only if every part did. out
// must not exist yet or be empty; report.json is written last, so a merge
// that died half-way leaves a directory check refuses.
func Merge(out string, dirs []string) (*Report, error) {
	if len(dirs) == 0 {
		return nil, errors.New("loadgen: merge: no run directories")
	}
	var parts []part
	seen := map[string]string{}
	for _, d := range dirs {
		p := part{dir: d}
		if err := readJSON(filepath.Join(d, RunFile), &p.info); err != nil {
			return nil, err
		}
		if err := readJSON(filepath.Join(d, ReportJSON), &p.rep); err != nil {
			if isNotExist(err) {
				return nil, fmt.Errorf("loadgen: merge: %s has no %s: the run did not end", d, ReportJSON)
			}
			return nil, err
		}
		if err := readJSON(filepath.Join(d, CountersFile), &p.counters); err != nil && !isNotExist(err) {
			return nil, err
		}
		id := p.info.Run + " " + p.info.Shard
		if prev, ok := seen[id]; ok {
			return nil, fmt.Errorf("loadgen: merge: %s and %s are the same run (%s)", prev, d, strings.TrimSpace(id))
		}
		seen[id] = d
		parts = append(parts, p)
	}
	info, err := mergeInfo(parts)
	if err != nil {
		return nil, err
	}
	if ents, err := os.ReadDir(out); err == nil && len(ents) > 0 {
		return nil, fmt.Errorf("loadgen: merge: %s exists and is not empty", out)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	for _, name := range []string{AcceptedFile, RejectedFile, DeliveredFile, GaveUpFile} {
		var srcs []string
		for _, p := range parts {
			srcs = append(srcs, filepath.Join(p.dir, name))
		}
		if err := concatFiles(filepath.Join(out, name), srcs); err != nil {
			return nil, err
		}
	}
	if err := atomicfile.WriteJSON(filepath.Join(out, RunFile), info, 0o644); err != nil {
		return nil, err
	}
	if err := atomicfile.WriteJSON(filepath.Join(out, CountersFile), mergeCounters(parts), 0o644); err != nil {
		return nil, err
	}
	rep, err := mergeReport(out, info, parts)
	if err != nil {
		return nil, err
	}
	if err := WriteReport(out, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

func mergeInfo(parts []part) (RunInfo, error) {
	info := RunInfo{Run: parts[0].info.Run, Profile: parts[0].info.Profile, Duration: parts[0].info.Duration,
		Seed: parts[0].info.Seed, Start: parts[0].info.Start, Plan: Plan{Devices: parts[0].info.Plan.Devices}}
	names := map[string]bool{}
	var stackErr error
	for _, p := range parts {
		pi := p.info
		if pi.Plan.Devices != info.Plan.Devices {
			return RunInfo{}, fmt.Errorf("loadgen: merge: %s has %d devices per user, %s %d", p.dir, pi.Plan.Devices, parts[0].dir, info.Plan.Devices)
		}
		names[pi.Run] = true
		info.Rate += pi.Rate
		if pi.Start.Before(info.Start) {
			info.Start = pi.Start
		}
		info.Plan.Users = append(info.Plan.Users, pi.Plan.Users...)
		info.Plan.Conversations = append(info.Plan.Conversations, pi.Plan.Conversations...)
		label := pi.Run
		if pi.Shard != "" {
			label += " " + pi.Shard
		}
		info.Parts = append(info.Parts, label)
		if err := mergeStack(&info.Stack, pi.Stack); err != nil && stackErr == nil {
			stackErr = fmt.Errorf("loadgen: merge: %s drove another stack: %w", p.dir, err)
		}
	}
	if stackErr != nil {
		return RunInfo{}, stackErr
	}
	if len(names) > 1 {
		var ns []string
		for n := range names {
			ns = append(ns, n)
		}
		sort.Strings(ns)
		info.Run = strings.Join(ns, "+")
	}
	// Parts of one plan never share a user or a conversation; other runs
	// use other names, so their ids differ too. Anything shared would be
	// checked twice: refuse it.
	us, cs := map[string]bool{}, map[string]bool{}
	for _, u := range info.Plan.Users {
		if us[u] {
			return RunInfo{}, fmt.Errorf("loadgen: merge: user %s is in two parts", u)
		}
		us[u] = true
	}
	for _, c := range info.Plan.Conversations {
		if cs[c.ID] {
			return RunInfo{}, fmt.Errorf("loadgen: merge: conversation %s is in two parts", c.ID)
		}
		cs[c.ID] = true
	}
	return info, nil
}

// mergeStack fills dst's empty fields from s; the world (Kafka, topic,
// Postgres) must be one. Gateways may differ: they are only recorded.
func mergeStack(dst *Stack, s Stack) error {
	if dst.WebSocket == "" {
		dst.WebSocket = s.WebSocket
	}
	if len(dst.Kafka) == 0 {
		dst.Kafka = s.Kafka
	}
	pick := func(d *string, v, what string) error {
		if *d == "" {
			*d = v
		} else if v != "" && v != *d {
			return fmt.Errorf("%s %s, not %s", what, v, *d)
		}
		return nil
	}
	if err := pick(&dst.Topic, s.Topic, "topic"); err != nil {
		return err
	}
	if err := pick(&dst.Postgres, s.Postgres, "postgres"); err != nil {
		return err
	}
	if dst.VShards == 0 {
		dst.VShards = s.VShards
	}
	if dst.Partitions == 0 {
		dst.Partitions = s.Partitions
	}
	return nil
}

func mergeCounters(parts []part) Counters {
	var c Counters
	c.Phase = "report"
	for _, p := range parts {
		x := p.counters
		if x.SendStart > 0 && (c.SendStart == 0 || x.SendStart < c.SendStart) {
			c.SendStart = x.SendStart
		}
		c.SendEnd = max(c.SendEnd, x.SendEnd)
		c.At = max(c.At, x.At)
		c.Offered += x.Offered
		c.Sent += x.Sent
		c.Commands += x.Commands
		c.Resends += x.Resends
		c.GivenUp += x.GivenUp
		c.Membership += x.Membership
		c.Errors += x.Errors
		c.Reconnects += x.Reconnects
		c.Unanswered += x.Unanswered
		c.Retries = addCounts(c.Retries, x.Retries)
		c.Refused = addCounts(c.Refused, x.Refused)
	}
	// First sends per second, aligned on the earliest send phase's start.
	for _, p := range parts {
		x := p.counters
		if x.SendStart == 0 {
			continue
		}
		off := int((x.SendStart - c.SendStart) / int64(time.Second))
		for i, n := range x.SentPerSec {
			for len(c.SentPerSec) <= off+i {
				c.SentPerSec = append(c.SentPerSec, 0)
			}
			c.SentPerSec[off+i] += n
		}
	}
	return c
}

func addCounts(dst, m map[string]int64) map[string]int64 {
	if len(m) == 0 {
		return dst
	}
	if dst == nil {
		dst = map[string]int64{}
	}
	for k, v := range m {
		dst[k] += v
	}
	return dst
}

func mergeReport(out string, info RunInfo, parts []part) (*Report, error) {
	rep := &Report{Run: info.Run, Shard: strings.Join(info.Parts, ", "), Profile: info.Profile, Status: StatusFinished,
		Rate: info.Rate, Duration: info.Duration, Start: parts[0].rep.Start, End: parts[0].rep.End, Devices: info.Plan.Devices,
		Users: len(info.Plan.Users), Conversations: len(info.Plan.Conversations), DeliveryMode: "not served"}
	var failed []string
	var acc, del []Latency
	for _, p := range parts {
		r := p.rep
		if r.Start.Before(rep.Start) {
			rep.Start = r.Start
		}
		if r.End.After(rep.End) {
			rep.End = r.End
		}
		if r.Status != StatusFinished {
			failed = append(failed, fmt.Sprintf("%s: %s in phase %s: %s", p.dir, r.Status, r.Phase, r.Error))
		}
		if r.DeliveryMode == "served" {
			rep.DeliveryMode = "served"
		}
		acc, del = append(acc, r.AcceptedLat), append(del, r.DeliveryLat)
	}
	if len(failed) > 0 {
		rep.Status, rep.Phase, rep.Error = StatusFailed, "merged", strings.Join(failed, "; ")
	}
	tot, err := ReadTotals(out)
	if err != nil {
		return nil, err
	}
	tot.Apply(rep)
	if rep.DeliveryLat, err = MergeLatency(del...); err != nil {
		return nil, err
	}
	if rep.AcceptedLat.Count == 0 { // parts recorded before accepted latency was read from the files
		if rep.AcceptedLat, err = MergeLatency(acc...); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// WriteReport writes plot.svg, report.md and report.json into dir, each
// crash-safe; report.json last, as it marks a run that ended.
func WriteReport(dir string, rep *Report) error {
	if err := atomicfile.Write(filepath.Join(dir, PlotFile), []byte(rep.Plot()), 0o644); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, ReportMD), []byte(rep.Markdown()), 0o644); err != nil {
		return err
	}
	return atomicfile.WriteJSON(filepath.Join(dir, ReportJSON), rep, 0o644)
}

// concatFiles writes the concatenation of srcs (missing ones are empty)
// to dst through a temp name, synced, then renamed.
func concatFiles(dst string, srcs []string) error {
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	defer os.Remove(tmp)
	for _, s := range srcs {
		if err := appendFile(f, s); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("loadgen: sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	return nil
}

// appendFile copies src's whole lines to w (a torn last line is dropped).
func appendFile(w io.Writer, src string) error {
	f, err := os.Open(src)
	if isNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	// The length up to the last newline: look for it in the tail.
	n := st.Size()
	buf := make([]byte, 64<<10)
	for n > 0 {
		off := max(n-int64(len(buf)), 0)
		k, err := f.ReadAt(buf[:n-off], off)
		if err != nil && err != io.EOF {
			return fmt.Errorf("loadgen: read %s: %w", src, err)
		}
		if i := bytes.LastIndexByte(buf[:k], '\n'); i >= 0 {
			n = off + int64(i) + 1
			break
		}
		n = off
	}
	if _, err := io.Copy(w, io.NewSectionReader(f, 0, n)); err != nil {
		return fmt.Errorf("loadgen: copy %s: %w", src, err)
	}
	return nil
}

// Rebuild recomputes the report of the run directory dir from its files:
// for a run that died (killed, no report.json) it is the only report.
// It writes report.md and plot.svg, and report.json only if the run had
// one (a died run stays one that check refuses).
func Rebuild(dir string) (*Report, error) {
	var info RunInfo
	if err := readJSON(filepath.Join(dir, RunFile), &info); err != nil {
		return nil, err
	}
	rep := &Report{}
	had := true
	if err := readJSON(filepath.Join(dir, ReportJSON), rep); err != nil {
		if !isNotExist(err) {
			return nil, err
		}
		had = false
		phase, _ := os.ReadFile(filepath.Join(dir, PhaseFile))
		*rep = Report{Run: info.Run, Shard: info.Shard, Profile: info.Profile, Status: StatusDied, Phase: strings.TrimSpace(string(phase)),
			Error: "the run ended without a report", Start: info.Start, Rate: info.Rate, Duration: info.Duration,
			Users: len(info.Plan.Users), Devices: info.Plan.Devices, Conversations: len(info.Plan.Conversations), DeliveryMode: "unknown"}
	}
	tot, err := ReadTotals(dir)
	if err != nil {
		return nil, err
	}
	delivery := rep.DeliveryLat
	tot.Apply(rep)
	rep.DeliveryLat = delivery // not in the files: kept from report.json
	if !had {
		rep.End = time.Unix(0, tot.Counters.At).UTC()
	}
	if err := atomicfile.Write(filepath.Join(dir, PlotFile), []byte(rep.Plot()), 0o644); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(filepath.Join(dir, ReportMD), []byte(rep.Markdown()), 0o644); err != nil {
		return nil, err
	}
	if had {
		if err := atomicfile.WriteJSON(filepath.Join(dir, ReportJSON), rep, 0o644); err != nil {
			return nil, err
		}
	}
	return rep, nil
}
