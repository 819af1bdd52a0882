package inspect

import (
	"fmt"
	"html"
	"io"
	"sort"

	"github.com/kiln-build/kiln/internal/config"
)

var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"}

// WriteSVG draws one stacked bar per binary and platform: the bytes of the
// largest packages, the unattributed rest (function tables, headers), and the
// budget line where one is set.
func (r *SizeReport) WriteSVG(w io.Writer) error {
	totals := map[string]int64{}
	var widest int64
	for _, e := range r.Entries {
		for _, m := range e.Packages {
			totals[m.Name] += m.Bytes
		}
		widest = max(widest, e.Size, e.Budget)
	}
	names := make([]string, 0, len(totals))
	for n := range totals {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return totals[names[i]] > totals[names[j]] })
	if len(names) > len(palette)-1 {
		names = names[:len(palette)-1]
	}
	color := map[string]string{}
	for i, n := range names {
		color[n] = palette[i]
	}
	const other, rest = "other packages", "function tables, headers (unattributed)"
	color[other] = palette[len(palette)-1]
	color[rest] = "#d9d9d9"

	const left, barW, rowH, top = 260, 640, 28, 50
	height := top + rowH*len(r.Entries) + 40 + 18*((len(names)+2+2)/3)
	if widest == 0 {
		widest = 1
	}
	scale := func(n int64) float64 { return float64(n) * barW / float64(widest) }
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", left+barW+120, height)
	fmt.Fprintf(w, `<text x="10" y="24" font-size="16" font-weight="bold">Binary size by package</text>`+"\n")
	for i, e := range r.Entries {
		y := top + i*rowH
		fmt.Fprintf(w, `<text x="10" y="%d">%s %s</text>`+"\n", y+16, html.EscapeString(e.Binary), html.EscapeString(e.Platform))
		x := float64(left)
		segment := func(name string, n int64) {
			if n <= 0 {
				return
			}
			wd := scale(n)
			fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="20" fill="%s"><title>%s: %s</title></rect>`+"\n",
				x, y+2, wd, color[name], html.EscapeString(name), config.FormatSize(n))
			x += wd
		}
		others := e.Attributed
		for _, m := range e.Packages {
			if _, ok := color[m.Name]; ok {
				segment(m.Name, m.Bytes)
				others -= m.Bytes
			}
		}
		segment(other, others)
		segment(rest, e.Size-e.Attributed)
		fmt.Fprintf(w, `<text x="%.1f" y="%d">%s</text>`+"\n", x+6, y+16, config.FormatSize(e.Size))
		if e.Budget > 0 {
			bx := float64(left) + scale(e.Budget)
			fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#000" stroke-width="2"><title>budget %s</title></line>`+"\n",
				bx, bx, y, y+24, config.FormatSize(e.Budget))
		}
	}
	legend := append(append([]string{}, names...), other, rest)
	for i, n := range legend {
		x := 10 + (i%3)*330
		y := top + rowH*len(r.Entries) + 20 + (i/3)*18
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, y, color[n], x+18, y+11, html.EscapeString(n))
	}
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}
