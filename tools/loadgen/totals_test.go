package loadgen

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/atomicfile"
)

func writeLines(t *testing.T, path string, vs ...any) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, v := range vs {
		b, _ := json.Marshal(v)
		f.Write(append(b, '\n'))
	}
}

// failedRunDir is a run that died in the converge phase: no report.json,
// its counters and records as the run left them (the last accepted line
// torn mid-write).
func failedRunDir(t *testing.T) (string, time.Time) {
	dir := t.TempDir()
	start := time.Unix(1700000000, 0)
	c := Counters{Phase: "converge", SendStart: start.UnixNano(), SendEnd: start.Add(3 * time.Second).UnixNano(),
		Offered: 300, Sent: 290, Commands: 320, Resends: 32, GivenUp: 4, Refused: map[string]int64{"budget": 4},
		Retries: map[string]int64{"timeout": 30, "rate_limited": 2}, SentPerSec: []int64{100, 100, 90}}
	if err := atomicfile.WriteJSON(filepath.Join(dir, CountersFile), c, 0o644); err != nil {
		t.Fatal(err)
	}
	acc := filepath.Join(dir, AcceptedFile)
	writeLines(t, acc, Accepted{Op: "create", Conv: "c1", Seq: 1, MessageID: "C"})
	// 200 messages answered in second 1 with latency 10 ms, 50 in second
	// 3 with latency 1 s; a duplicate and a probe that do not count.
	for i := 0; i < 250; i++ {
		due, lat := start.Add(time.Duration(i)*time.Millisecond), 10*time.Millisecond
		if i >= 200 {
			due, lat = start.Add(1500*time.Millisecond), time.Second
		}
		writeLines(t, acc, Accepted{Op: "send", Conv: "c1", Seq: int64(i + 2), MessageID: "M", ClientMessageID: "m1",
			Due: due.UnixNano(), Sent: due.UnixNano(), At: due.Add(lat).UnixNano()})
	}
	writeLines(t, acc, Accepted{Op: "send", Conv: "c1", Seq: 2, ClientMessageID: "m0", Dup: true, Due: start.UnixNano(), At: start.UnixNano()},
		Accepted{Op: "send", Conv: "c1", Seq: 9, ClientMessageID: "p1", Due: start.UnixNano(), At: start.UnixNano()})
	f, _ := os.OpenFile(acc, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"op":"send","c":"c1","s":99`)
	f.Close()
	writeLines(t, filepath.Join(dir, RejectedFile), Rejected{Op: "send", Code: "forbidden", Probe: true}, Rejected{Op: "send", Code: "forbidden"})
	writeLines(t, filepath.Join(dir, DeliveredFile), Delivered{Device: "u/0"}, Delivered{Device: "u/1"}, Delivered{Device: "u/0"})
	return dir, start
}

func TestTotalsFromTheFilesOfAFailedRun(t *testing.T) {
	dir, _ := failedRunDir(t)
	tot, err := ReadTotals(dir)
	if err != nil {
		t.Fatal(err)
	}
	rep := &Report{Status: StatusFailed, Phase: "converge"}
	tot.Apply(rep)
	if rep.Offered != 300 || rep.Sent != 290 || rep.Accepted != 250 || rep.Duplicates != 1 || rep.Deliveries != 3 {
		t.Fatalf("offered %d sent %d accepted %d dups %d deliveries %d", rep.Offered, rep.Sent, rep.Accepted, rep.Duplicates, rep.Deliveries)
	}
	if rep.Resends != 32 || rep.GivenUp != 4 || rep.ResendShare != 0.1 || rep.Retries["timeout"] != 30 || rep.Rejects["forbidden"] != 2 {
		t.Fatalf("resends %d given up %d share %v retries %v rejects %v", rep.Resends, rep.GivenUp, rep.ResendShare, rep.Retries, rep.Rejects)
	}
	// 250 answers between send start and the last answer at 2.5 s: the
	// send phase (3 s) bounds the time.
	if rep.AcceptedPerSec < 83 || rep.AcceptedPerSec > 84 {
		t.Errorf("accepted/s %v, want 250/3", rep.AcceptedPerSec)
	}
	l := rep.AcceptedLat
	if l.Count != 250 || l.P50MS < 9.9 || l.P50MS > 10.1 || l.P99MS < 999 || l.P99MS > 1001 || l.HDR == "" {
		t.Errorf("latency %+v", l)
	}
	if len(rep.Timeline) != 3 || rep.PeakPerSec != 200 {
		t.Fatalf("timeline %+v peak %d", rep.Timeline, rep.PeakPerSec)
	}
	s1, s3 := rep.Timeline[0], rep.Timeline[2]
	if s1.Sent != 100 || s1.Accepted != 200 || s1.P99MS > 10.1 || s3.Accepted != 50 || s3.P50MS < 999 || rep.Timeline[1].Accepted != 0 {
		t.Errorf("timeline %+v", rep.Timeline)
	}
}

func TestPlotIsWellFormedSVG(t *testing.T) {
	dir, _ := failedRunDir(t)
	tot, err := ReadTotals(dir)
	if err != nil {
		t.Fatal(err)
	}
	rep := &Report{Run: "r<1>", Status: StatusFailed, Phase: "converge", Rate: 100, Duration: "3s"}
	tot.Apply(rep)
	svg := rep.Plot()
	d := xml.NewDecoder(strings.NewReader(svg))
	paths := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "path" {
			paths++
			for _, a := range se.Attr {
				if a.Name.Local == "d" && !strings.HasPrefix(a.Value, "M") {
					t.Errorf("path %q", a.Value)
				}
			}
		}
	}
	if paths != 4 || !strings.Contains(svg, "failed in converge") || !strings.Contains(svg, "r&lt;1&gt;") {
		t.Errorf("%d paths:\n%s", paths, svg)
	}
	if empty := (&Report{Run: "e"}).Plot(); !strings.Contains(empty, "no timeline") {
		t.Error("an empty timeline drew something")
	}
}

func TestRebuildADiedRun(t *testing.T) {
	dir, start := failedRunDir(t)
	atomicfile.WriteJSON(filepath.Join(dir, RunFile), RunInfo{Run: "r", Rate: 100, Duration: "3s", Start: start, Plan: Plan{Users: []string{"a", "b"}, Devices: 2}}, 0o644)
	atomicfile.Write(filepath.Join(dir, PhaseFile), []byte("converge\n"), 0o644)
	rep, err := Rebuild(dir)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusDied || rep.Phase != "converge" || rep.Accepted != 250 || rep.Sent != 290 || rep.Users != 2 {
		t.Fatalf("rebuilt %+v", rep)
	}
	md, _ := os.ReadFile(filepath.Join(dir, ReportMD))
	if !strings.Contains(string(md), "| status | died (in phase converge") || !strings.Contains(string(md), "300 / 290 / 250") {
		t.Errorf("report.md:\n%s", md)
	}
	if _, err := os.Stat(filepath.Join(dir, ReportJSON)); !os.IsNotExist(err) {
		t.Error("a died run got a report.json")
	}
	if _, err := os.Stat(filepath.Join(dir, PlotFile)); err != nil {
		t.Error(err)
	}
}
