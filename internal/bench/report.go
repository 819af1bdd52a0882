package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/bench/measure"
	"github.com/kiln-build/kiln/internal/config"
)

// write stores the report as JSON (timestamped and latest.json), Markdown
// and an SVG chart, and returns the paths.
func write(r *Report, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	stamped := filepath.Join(dir, "bench-"+r.Date.Format("20060102T150405Z")+".json")
	files := []string{stamped, filepath.Join(dir, "latest.json"), filepath.Join(dir, "report.md"), filepath.Join(dir, "chart.svg")}
	writers := []func(io.Writer) error{
		func(w io.Writer) error { _, err := w.Write(data); return err },
		func(w io.Writer) error { _, err := w.Write(data); return err },
		r.WriteMarkdown,
		r.WriteSVG,
	}
	for i, f := range files {
		if err := atomicfile.Write(f, writers[i]); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// Read loads a JSON report.
func Read(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: not a bench report: %w", path, err)
	}
	return &r, nil
}

func secs(d time.Duration) string {
	if d < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func bytesOrNA(n int64) string {
	if n < 0 {
		return "n/a"
	}
	if n == 0 {
		return "-"
	}
	return config.FormatSize(n)
}

// ratio is the scenario against its baseline, naming a baseline that is
// not native (the fresh-daemon scenarios compare with kiln cold).
func ratio(s Scenario) string {
	if s.Ratio == 0 {
		return "-"
	}
	if !strings.HasPrefix(s.Baseline, "native") {
		return fmt.Sprintf("%.2fx of %s", s.Ratio, s.Baseline)
	}
	return fmt.Sprintf("%.2fx", s.Ratio)
}

func roundRatios(rs []float64) string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%.2fx", r))
	}
	return strings.Join(out, ", ")
}

func steps(s Scenario) string {
	if s.Kind != "kiln" {
		return "-"
	}
	return fmt.Sprintf("%d/%d", s.Ran, s.Ran+s.Reused)
}

// WriteTable prints the scenarios for a terminal.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tMEDIAN\tMIN\tMAX\tCPU\tSYSTEM MEM\tRSS PEAK\tGO CACHE\tSTEPS RAN\tVS BASELINE")
	for _, s := range r.Scenarios {
		if s.Note != "" && len(s.Runs) == 0 {
			fmt.Fprintf(tw, "%s\t%s\n", s.Name, s.Note)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, secs(s.Median), secs(s.Min), secs(s.Max), secs(s.CPU), bytesOrNA(s.SystemMemory), bytesOrNA(s.PeakMemory), bytesOrNA(s.GoCache), steps(s), ratio(s))
	}
	if r.CgoSplitRatio > 0 {
		fmt.Fprintf(tw, "cgo split / uniform\t%.2fx\t(seed: %.2fx)\n", r.CgoSplitRatio, r.SeedCgoRatio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p := r.Projection; p != nil {
		fmt.Fprintf(w, "projected for %d machines (each node's share alone): critical path %s, %.2fx one daemon\n", p.Daemons, secs(p.CriticalPath), p.Ratio)
	}
	for _, retried := range r.Retried {
		fmt.Fprintf(w, "failed once and run again from its start: %s\n", retried)
	}
	if len(r.Only) > 0 {
		fmt.Fprintf(w, "only the scenarios of %s (-only)\n", strings.Join(r.Only, ", "))
	}
	return nil
}

// WriteMarkdown writes the report people read.
func (r *Report) WriteMarkdown(w io.Writer) error {
	m := r.Machine
	fmt.Fprintf(w, "# kiln bench, %s\n\n", r.Date.Format(time.RFC3339))
	fmt.Fprintf(w, "Module `%s`: %s for %s. Machine: %d cores, %s; host %s, toolchain %s, BuildKit %s, kiln %.12s.\n\n",
		r.Module, strings.Join(r.Binaries, ", "), strings.Join(r.Platforms, ", "), m.Cores, config.FormatSize(m.Memory), m.HostGo, m.Toolchain, m.BuildKit, m.KilnCommit)
	if m.DeadMemoryCgroups >= 0 {
		freed := ""
		if m.FreedMemoryCgroups {
			freed = ", after the bench dropped the page cache to free them"
		}
		fmt.Fprintf(w, "Dead memory cgroups (removed, kept by their page cache; hundreds slow every step): %d when the timing began%s, %d at its end.\n\n", m.DeadMemoryCgroups, freed, m.DeadMemoryCgroupsEnd)
	}
	for _, retried := range r.Retried {
		fmt.Fprintf(w, "Failed once and run again from its start: %s.\n\n", retried)
	}
	if len(r.Only) > 0 {
		fmt.Fprintf(w, "Only the scenarios of %s (-only), with the cold runs they start from.\n\n", strings.Join(r.Only, ", "))
	}
	if r.ModuleDownload != "" {
		fmt.Fprintf(w, "Module download in the cold scenarios: %s.\n\n", r.ModuleDownload)
	}
	fmt.Fprintf(w, "Incremental edits: one binary `%s`, shared `%s`.\n\n", r.OneBinaryEdit, r.SharedEdit)
	fmt.Fprintln(w, "| scenario | median | min | max | CPU | system memory | RSS peak | Go cache | steps ran | vs baseline |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, s := range r.Scenarios {
		if s.Note != "" && len(s.Runs) == 0 {
			fmt.Fprintf(w, "| %s | %s |  |  |  |  |  |  |  |  |\n", s.Name, s.Note)
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Name, secs(s.Median), secs(s.Min), secs(s.Max), secs(s.CPU), bytesOrNA(s.SystemMemory), bytesOrNA(s.PeakMemory), bytesOrNA(s.GoCache), steps(s), ratio(s))
	}
	fmt.Fprintln(w)
	for _, s := range r.Scenarios {
		if s.Description != "" {
			fmt.Fprintf(w, "- **%s**: %s", s.Name, s.Description)
			if len(s.StepsRan) > 0 && len(s.StepsRan) <= 12 {
				fmt.Fprintf(w, "; steps that ran: %s", strings.Join(s.StepsRan, ", "))
			}
			if len(s.RoundRatios) > 1 {
				fmt.Fprintf(w, "; round by round: %s", roundRatios(s.RoundRatios))
			}
			if longest := longestSteps(s.StepTimes, 4); longest != "" {
				fmt.Fprintf(w, "; longest: %s", longest)
			}
			fmt.Fprintln(w)
		}
	}
	writeSystemMemory(w, r.Scenarios)
	writeMemoryBreakdown(w, r.Scenarios)
	writeCPUBreakdown(w, r.Scenarios)
	writeProjection(w, r.Projection)
	if r.CgoSplitRatio > 0 {
		fmt.Fprintf(w, "\nThe cgo split costs **%.2fx** the uniform build here (Antrea measured %.2fx: 9m49s against 6m42s). It runs natively, because kiln never builds with cgo.\n", r.CgoSplitRatio, r.SeedCgoRatio)
	}
	if !m.DaemonMeasured {
		fmt.Fprintln(w, "\nCPU and memory of kiln's builds are n/a: the daemon is not the managed local one, so its processes cannot be read.")
	}
	_, err := fmt.Fprintln(w, "\nCPU is user+system time of the build processes (for kiln: buildkitd and the steps it ran). System memory is the largest rise of the machine's used memory (MemTotal - MemAvailable, sampled every 100 ms) over the run, tmpfs included: what the memory target applies to. RSS peak is the largest resident set of the build processes, with kiln's client (this process) counted for kiln; it cannot see tmpfs.")
	return err
}

// writeSystemMemory is a table of each kiln scenario's system memory
// against its native baseline's, with what tmpfs held at kiln's peak and in
// which mounts.
func writeSystemMemory(w io.Writer, scenarios []Scenario) {
	rows := slices.DeleteFunc(slices.Clone(scenarios), func(s Scenario) bool { return s.Kind != "kiln" || s.SystemMemory < 0 || len(s.Runs) == 0 })
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nMemory as the machine feels it (the rise of used memory, tmpfs included), kiln against its native baseline:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | kiln | native | kiln over native | tmpfs at kiln's peak | tmpfs mounts then |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | --- |")
	for _, s := range rows {
		native, over := "-", "-"
		if b, ok := baselineOf(scenarios, s); ok && b.SystemMemory >= 0 {
			native, over = bytesOrNA(b.SystemMemory), signedBytes(s.SystemMemory-b.SystemMemory)
		}
		var mounts []string
		for _, m := range slices.Sorted(maps.Keys(s.TmpfsMounts)) {
			mounts = append(mounts, fmt.Sprintf("%s %s", m, bytesOrNA(s.TmpfsMounts[m])))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", s.Name, bytesOrNA(s.SystemMemory), native, over, bytesOrNA(s.Tmpfs), strings.Join(mounts, ", "))
	}
}

// baselineOf is the native scenario s is measured against.
func baselineOf(scenarios []Scenario, s Scenario) (Scenario, bool) {
	for _, b := range scenarios {
		if b.Name == s.Baseline {
			return b, true
		}
	}
	return Scenario{}, false
}

// signedBytes is a difference of sizes with its sign.
func signedBytes(n int64) string {
	switch {
	case n == 0:
		return "0"
	case n < 0:
		return "-" + bytesOrNA(-n)
	}
	return "+" + bytesOrNA(n)
}

// processGroups is the column order of the memory breakdown.
var processGroups = []string{measure.GroupBuildkitd, measure.GroupRunc, measure.GroupGo, measure.GroupCompile, measure.GroupLink, measure.GroupClient, measure.GroupOther}

// writeMemoryBreakdown is a table of each scenario's peak memory by process
// group: where a build's memory goes.
func writeMemoryBreakdown(w io.Writer, scenarios []Scenario) {
	rows := slices.DeleteFunc(slices.Clone(scenarios), func(s Scenario) bool { return len(s.PeakByProcess) == 0 })
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nPeak memory by process group (each group's own peak; they peak at different times, so a row can add up to more than the total):")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| scenario | total | %s |\n", strings.Join(processGroups, " | "))
	fmt.Fprintf(w, "| --- | ---: |%s\n", strings.Repeat(" ---: |", len(processGroups)))
	for _, s := range rows {
		fmt.Fprintf(w, "| %s | %s |", s.Name, bytesOrNA(s.PeakMemory))
		for _, g := range processGroups {
			if n, ok := s.PeakByProcess[g]; ok {
				fmt.Fprintf(w, " %s |", bytesOrNA(n))
			} else {
				fmt.Fprint(w, " - |")
			}
		}
		fmt.Fprintln(w)
	}
}

// writeCPUBreakdown is a table of each kiln scenario's CPU time: the
// daemon's own, the steps' and the client's, against the native baseline's.
func writeCPUBreakdown(w io.Writer, scenarios []Scenario) {
	rows := slices.DeleteFunc(slices.Clone(scenarios), func(s Scenario) bool { return len(s.CPUByProcess) == 0 })
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nCPU of kiln's builds by part (medians of each part, so a row need not add up to the CPU column):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | buildkitd | steps | client | native baseline |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
	for _, s := range rows {
		base := "-"
		if b, ok := baselineOf(scenarios, s); ok && b.CPU >= 0 {
			base = secs(b.CPU)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", s.Name, secs(s.CPUByProcess[measure.CPUDaemon]), secs(s.CPUByProcess[measure.CPUSteps]), secs(s.CPUByProcess[measure.CPUClient]), base)
	}
}

// WriteSVG draws each kiln scenario beside the native one it is measured against.
func (r *Report) WriteSVG(w io.Writer) error {
	type bar struct {
		label string
		kiln  time.Duration
		base  time.Duration
		ratio float64
	}
	var bars []bar
	var longest time.Duration
	for _, s := range r.Scenarios {
		if s.Kind != "kiln" || len(s.Runs) == 0 {
			continue
		}
		b := bar{label: s.Name, kiln: s.Median, ratio: s.Ratio}
		if base := r.Scenario(s.Baseline); base != nil {
			b.base = base.Median
		}
		bars = append(bars, b)
		longest = max(longest, b.kiln, b.base)
	}
	if longest == 0 {
		longest = time.Second
	}
	const left, width, row = 230, 560, 46
	height := 70 + row*len(bars) + 30
	scale := func(d time.Duration) float64 { return float64(d) / float64(longest) * width }
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", left+width+140, height)
	fmt.Fprintf(w, `<text x="10" y="24" font-size="16" font-weight="bold">kiln against native go build (median wall time)</text>`+"\n")
	fmt.Fprintf(w, `<text x="10" y="44" fill="#555">%s · %d cores · %s</text>`+"\n", html.EscapeString(r.Module), r.Machine.Cores, html.EscapeString(strings.Join(r.Platforms, ", ")))
	for i, b := range bars {
		y := 60 + i*row
		fmt.Fprintf(w, `<text x="10" y="%d">%s</text>`+"\n", y+16, html.EscapeString(b.label))
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="%.1f" height="16" fill="#4e79a7"/><text x="%.1f" y="%d">%s kiln`, left, y+3, scale(b.kiln), float64(left)+scale(b.kiln)+6, y+16, secs(b.kiln))
		if b.ratio > 0 {
			fmt.Fprintf(w, " (%.2fx)", b.ratio)
		}
		fmt.Fprintln(w, "</text>")
		if b.base > 0 {
			fmt.Fprintf(w, `<rect x="%d" y="%d" width="%.1f" height="16" fill="#bab0ac"/><text x="%.1f" y="%d" fill="#555">%s native</text>`+"\n", left, y+21, scale(b.base), float64(left)+scale(b.base)+6, y+34, secs(b.base))
		}
	}
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}

// Compare prints, per scenario, the old and new medians and the change.
func Compare(w io.Writer, old, new *Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SCENARIO\tOLD\tNEW\tCHANGE\n")
	for _, s := range new.Scenarios {
		o := old.Scenario(s.Name)
		if o == nil || len(o.Runs) == 0 || len(s.Runs) == 0 {
			fmt.Fprintf(tw, "%s\t-\t%s\tnew\n", s.Name, secs(s.Median))
			continue
		}
		change := "0%"
		if o.Median > 0 {
			change = fmt.Sprintf("%+.1f%%", (float64(s.Median)/float64(o.Median)-1)*100)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, secs(o.Median), secs(s.Median), change)
	}
	for _, o := range old.Scenarios {
		if new.Scenario(o.Name) == nil {
			fmt.Fprintf(tw, "%s\t%s\t-\tgone\n", o.Name, secs(o.Median))
		}
	}
	return tw.Flush()
}

// CompareFiles reads two reports and compares them.
func CompareFiles(w io.Writer, oldPath, newPath string) error {
	old, err := Read(oldPath)
	if err != nil {
		return err
	}
	new, err := Read(newPath)
	if err != nil {
		return err
	}
	return Compare(w, old, new)
}

// longestSteps names the n steps that took longest, with their times.
func longestSteps(times map[string]time.Duration, n int) string {
	names := slices.Collect(maps.Keys(times))
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(times[b], times[a]), cmp.Compare(a, b)) })
	var parts []string
	for _, name := range names[:min(n, len(names))] {
		parts = append(parts, fmt.Sprintf("%s %s", name, secs(times[name])))
	}
	return strings.Join(parts, ", ")
}
