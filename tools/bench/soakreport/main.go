// Command soakreport turns tools/bench/soak.sh's samples.tsv (minute, process,
// rss_kib, goroutines) into the soak's plateau table (Markdown, on stdout)
// and a plot of RSS and goroutines over time per process (SVG).
//
// The reference sample is the one nearest minute 10, and the plateau
// window is the last 10 minutes; a run shorter than 30 minutes uses a third
// of its length for both (its reference is at 1/3 of the run, its window
// the last third). A process plateaus when every sample of the window is
// within -tolerance (10 %) of the reference, for RSS and goroutines alike.
//
//	go run ./tools/bench/soakreport -samples R/samples.tsv -secs 1800 -svg R/soak.svg > table.md
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

type sample struct {
	min        float64
	rss        float64 // KiB
	goroutines float64 // NaN: not read
}

func main() {
	path := flag.String("samples", "samples.tsv", "samples.tsv written by tools/bench/soak.sh")
	secs := flag.Float64("secs", 0, "length of the load in seconds (default: the last sample's time)")
	svgOut := flag.String("svg", "", "write the plot here")
	tol := flag.Float64("tolerance", 10, "plateau tolerance in % of the reference value")
	flag.Parse()

	procs, order, err := read(*path)
	if err != nil {
		log.Fatal(err)
	}
	if len(order) == 0 {
		log.Fatal("soakreport: no samples")
	}
	total := *secs / 60
	if total <= 0 {
		for _, ss := range procs {
			total = math.Max(total, ss[len(ss)-1].min)
		}
	}
	ref := math.Min(10, total/3)
	table(os.Stdout, procs, order, total, ref, *tol)
	if *svgOut != "" {
		f, err := os.Create(*svgOut)
		if err != nil {
			log.Fatal(err)
		}
		plot(f, procs, order, total, ref)
		if err := f.Close(); err != nil {
			log.Fatal(err)
		}
	}
}

func read(path string) (map[string][]sample, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	procs := map[string][]sample{}
	var order []string
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) < 4 || fs[0] == "minute" {
			continue
		}
		m, err1 := strconv.ParseFloat(fs[0], 64)
		rss, err2 := strconv.ParseFloat(fs[2], 64)
		if err1 != nil || err2 != nil {
			continue // a process that was gone at that sample
		}
		g, err := strconv.ParseFloat(fs[3], 64)
		if err != nil {
			g = math.NaN()
		}
		if _, ok := procs[fs[1]]; !ok {
			order = append(order, fs[1])
		}
		procs[fs[1]] = append(procs[fs[1]], sample{m, rss, g})
	}
	for _, ss := range procs {
		sort.Slice(ss, func(i, j int) bool { return ss[i].min < ss[j].min })
	}
	return procs, order, sc.Err()
}

// nearest is the sample closest to minute m.
func nearest(ss []sample, m float64) sample {
	best := ss[0]
	for _, s := range ss {
		if math.Abs(s.min-m) < math.Abs(best.min-m) {
			best = s
		}
	}
	return best
}

// maxDev is the largest |v - ref| / ref in % over the samples from minute
// from on; NaN if ref or every value is unknown.
func maxDev(ss []sample, from, ref float64, v func(sample) float64) float64 {
	dev := math.NaN()
	if math.IsNaN(ref) || ref == 0 {
		return dev
	}
	for _, s := range ss {
		if s.min+1e-9 < from || math.IsNaN(v(s)) {
			continue
		}
		d := math.Abs(v(s)-ref) / ref * 100
		if math.IsNaN(dev) || d > dev {
			dev = d
		}
	}
	return dev
}

func table(w io.Writer, procs map[string][]sample, order []string, total, ref, tol float64) {
	window := total - ref
	refLabel := "min " + strconv.FormatFloat(math.Round(ref*10)/10, 'f', -1, 64)
	fmt.Fprintf(w, "| process | RSS %s (MiB) | RSS end (MiB) | RSS max dev., last %s min | goroutines %s | goroutines end | goroutines max dev. | plateau |\n",
		refLabel, strconv.FormatFloat(math.Round(ref*10)/10, 'f', -1, 64), refLabel)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---|")
	all := true
	rss := func(s sample) float64 { return s.rss }
	gor := func(s sample) float64 { return s.goroutines }
	for _, p := range order {
		ss := procs[p]
		r, e := nearest(ss, ref), ss[len(ss)-1]
		dr := maxDev(ss, window, r.rss, rss)
		dg := maxDev(ss, window, r.goroutines, gor)
		ok := !math.IsNaN(dr) && dr <= tol && (math.IsNaN(dg) || dg <= tol)
		if e.min < total-ref/2 {
			ok = false // the process ended (or stopped answering) early
		}
		all = all && ok
		fmt.Fprintf(w, "| %s | %.1f | %.1f | %s | %s | %s | %s | %s |\n", p, r.rss/1024, e.rss/1024, pct(dr),
			num(r.goroutines), num(e.goroutines), pct(dg), yesNo(ok))
	}
	verdict := "yes"
	if !all {
		verdict = "no"
	}
	rule := "the last 10 minutes within 10 % of the minute-10 value"
	if ref < 10 {
		rule = fmt.Sprintf("a run under 30 min: the last third (%.1f min) within %.0f %% of the value at 1/3 of the run", ref, tol)
	} else if tol != 10 {
		rule = fmt.Sprintf("the last 10 minutes within %.0f %% of the minute-10 value", tol)
	}
	fmt.Fprintf(w, "\nEvery process plateaus (%s, RSS and goroutines): **%s**\n", rule, verdict)
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.1f %%", v)
}

func num(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

var colors = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// plot draws two panels, RSS (MiB) and goroutines, against minutes, one
// line per process, with the reference minute marked and the plateau
// window shaded.
func plot(w io.Writer, procs map[string][]sample, order []string, total, ref float64) {
	const W, H, left, right, top, panelH, gap = 900, 640, 70, 170, 30, 250, 60
	pw := float64(W - left - right)
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(w, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	panels := []struct {
		title string
		v     func(sample) float64
	}{
		{"RSS (MiB)", func(s sample) float64 { return s.rss / 1024 }},
		{"goroutines", func(s sample) float64 { return s.goroutines }},
	}
	x := func(m float64) float64 { return left + m/total*pw }
	for i, pn := range panels {
		y0 := float64(top + i*(panelH+gap))
		hi := 0.0
		for _, ss := range procs {
			for _, s := range ss {
				if v := pn.v(s); !math.IsNaN(v) {
					hi = math.Max(hi, v)
				}
			}
		}
		hi = niceCeil(hi)
		y := func(v float64) float64 { return y0 + panelH - v/hi*panelH }
		fmt.Fprintf(w, `<text x="%d" y="%.0f" font-weight="bold">%s</text>`+"\n", left, y0-8, pn.title)
		fmt.Fprintf(w, `<rect x="%.1f" y="%.0f" width="%.1f" height="%d" fill="#eef4ff"/>`+"\n", x(total-ref), y0, x(total)-x(total-ref), panelH)
		for k := 0; k <= 5; k++ {
			v := hi * float64(k) / 5
			fmt.Fprintf(w, `<line x1="%d" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`, left, left+pw, y(v), y(v))
			fmt.Fprintf(w, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, strconv.FormatFloat(v, 'f', -1, 64))
		}
		step := niceStep(total / 6)
		for k := 0; float64(k)*step <= total+1e-9; k++ {
			m := float64(k) * step
			fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#eee"/>`, x(m), x(m), y0, y0+panelH)
			fmt.Fprintf(w, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x(m), y0+panelH+15, strconv.FormatFloat(math.Round(m*100)/100, 'f', -1, 64))
		}
		fmt.Fprintf(w, `<text x="%.0f" y="%.0f" text-anchor="middle">minutes</text>`+"\n", left+pw/2, y0+panelH+30)
		fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#999" stroke-dasharray="4 3"/>`+"\n", x(ref), x(ref), y0, y0+panelH)
		fmt.Fprintf(w, `<rect x="%d" y="%.0f" width="%.0f" height="%d" fill="none" stroke="#333"/>`+"\n", left, y0, pw, panelH)
		for j, p := range order {
			var pts []string
			for _, s := range procs[p] {
				if v := pn.v(s); !math.IsNaN(v) {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.min), y(v)))
				}
			}
			if len(pts) > 0 {
				fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", colors[j%len(colors)], strings.Join(pts, " "))
			}
		}
	}
	for j, p := range order {
		ly := top + 10 + j*18
		fmt.Fprintf(w, `<line x1="%.0f" x2="%.0f" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>`, left+pw+15, left+pw+35, ly, ly, colors[j%len(colors)])
		fmt.Fprintf(w, `<text x="%.0f" y="%d">%s</text>`+"\n", left+pw+40, ly+4, p)
	}
	fmt.Fprintf(w, `<text x="%.0f" y="%d" fill="#666">dashed: reference</text>`+"\n", left+pw+15, top+20+len(order)*18)
	fmt.Fprintf(w, `<text x="%.0f" y="%d" fill="#666">sample (min %s);</text>`+"\n", left+pw+15, top+36+len(order)*18, strconv.FormatFloat(math.Round(ref*10)/10, 'f', -1, 64))
	fmt.Fprintf(w, `<text x="%.0f" y="%d" fill="#666">shaded: plateau window</text>`+"\n", left+pw+15, top+52+len(order)*18)
	fmt.Fprintln(w, "</svg>")
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}

func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}
