package loadgen

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// PlotFile is the run's picture: accepted/s and accepted latency per second.
const PlotFile = "plot.svg"

// Plot draws the report's timeline as an SVG: first sends/s and
// accepted/s on the left axis (linear), p50 and p99 accepted latency of
// each second's answers on the right axis (ms, logarithmic, so a p50 of
// milliseconds and a p99 of seconds both read). A small hand-written
// writer: no plotting dependency for one chart.
func (r *Report) Plot() string {
	const w, h, ml, mr, mt, mb = 900.0, 380.0, 64.0, 72.0, 40.0, 64.0
	pw, ph := w-ml-mr, h-mt-mb
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", w, h, w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	title := fmt.Sprintf("loadgen run %s — %s, %.0f msg/s offered for %s", r.Run, r.Status, r.Rate, r.Duration)
	if r.Status != StatusFinished {
		title += " (failed in " + r.Phase + ")"
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="14">%s</text>`+"\n", ml, html.EscapeString(title))
	n := len(r.Timeline)
	if n == 0 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">no timeline</text></svg>`+"\n", ml, mt+ph/2)
		return b.String()
	}
	// Axes' ranges.
	var top int64
	loMS, hiMS := math.Inf(1), 0.0
	for _, s := range r.Timeline {
		top = max(top, s.Accepted, s.Sent)
		if s.Accepted > 0 {
			loMS, hiMS = math.Min(loMS, math.Max(s.P50MS, 0.001)), math.Max(hiMS, s.P99MS)
		}
	}
	yTop := niceCeil(float64(max(top, 1)))
	lo, hi := -1.0, 1.0 // log10 ms
	if hiMS > 0 {
		lo, hi = math.Floor(math.Log10(loMS)), math.Ceil(math.Log10(hiMS))
		if hi <= lo {
			hi = lo + 1
		}
	}
	x := func(t int) float64 { return ml + pw*(float64(t)-0.5)/float64(n) }
	yL := func(v float64) float64 { return mt + ph*(1-v/yTop) }
	yR := func(ms float64) float64 {
		return mt + ph*(1-(math.Log10(math.Max(ms, 0.001))-lo)/(hi-lo))
	}
	// Frame, grid and ticks.
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#999"/>`+"\n", ml, mt, pw, ph)
	for i := 0; i <= 4; i++ {
		v := yTop * float64(i) / 4
		y := yL(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`, ml, y, ml+pw, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#1f5fa8">%s</text>`+"\n", ml-6, y+4, shortNum(v))
	}
	for e := lo; e <= hi; e++ {
		y := yR(math.Pow(10, e))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#b02020">%s</text>`+"\n", ml+pw+6, y+4, msLabel(math.Pow(10, e)))
	}
	step := max(1, niceStep(n))
	for t := step; t <= n; t += step {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`, x(t), mt+ph+16, t)
	}
	fmt.Fprintf(&b, "\n"+`<text x="%.1f" y="%.1f" text-anchor="middle">seconds since the send phase began</text>`+"\n", ml+pw/2, mt+ph+32)
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle" fill="#1f5fa8">messages/s</text>`+"\n", mt+ph/2)
	fmt.Fprintf(&b, `<text transform="translate(%.1f %.1f) rotate(90)" text-anchor="middle" fill="#b02020">accepted latency</text>`+"\n", w-14, mt+ph/2)
	// Series.
	line := func(color, dash string, pt func(s Second) (float64, bool)) {
		var d strings.Builder
		move := true
		for _, s := range r.Timeline {
			v, ok := pt(s)
			if !ok {
				move = true
				continue
			}
			cmd := "L"
			if move {
				cmd, move = "M", false
			}
			fmt.Fprintf(&d, "%s%.1f %.1f ", cmd, x(s.T), v)
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.6"%s/>`+"\n", strings.TrimSpace(d.String()), color, dash)
	}
	line("#9ab", ` stroke-dasharray="4 3"`, func(s Second) (float64, bool) { return yL(float64(s.Sent)), true })
	line("#1f5fa8", "", func(s Second) (float64, bool) { return yL(float64(s.Accepted)), true })
	line("#3a9a3a", "", func(s Second) (float64, bool) { return yR(s.P50MS), s.Accepted > 0 })
	line("#b02020", "", func(s Second) (float64, bool) { return yR(s.P99MS), s.Accepted > 0 })
	// Legend.
	items := []struct{ color, label string }{{"#9ab", "first sends/s"}, {"#1f5fa8", "accepted/s"}, {"#3a9a3a", "p50 accepted latency"}, {"#b02020", "p99 accepted latency"}}
	lx := ml
	for _, it := range items {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			lx, h-12, lx+18, h-12, it.color, lx+22, h-8, it.label)
		lx += 40 + 6*float64(len(it.label))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 × a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// niceStep picks a tick step for n seconds (about 10 ticks).
func niceStep(n int) int {
	if n <= 10 {
		return 1
	}
	return int(niceCeil(float64(n) / 10))
}

func shortNum(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}

func msLabel(ms float64) string {
	if ms >= 1000 {
		return fmt.Sprintf("%g s", ms/1000)
	}
	return fmt.Sprintf("%g ms", ms)
}
