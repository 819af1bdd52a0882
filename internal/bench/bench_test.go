package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/bench"
	"github.com/kiln-build/kiln/internal/bench/measure"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// fixture copies testdata/tinymod so that edits never touch the repository.
func fixture(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir("testdata/tinymod", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("testdata/tinymod", path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			data, _ := os.ReadFile(path)
			files[path] = string(data)
		}
		return nil
	})
	return files
}

func options(t *testing.T, module string) bench.Options {
	return bench.Options{
		Build: session.Options{Root: testdaemon.RepoRoot(t), Module: module, Packages: []string{"./cmd/alpha", "./cmd/beta"}, Platforms: "linux/amd64"},
		Runs:  1,
		Out:   t.TempDir(),
		Log:   io.Discard,
	}
}

func TestBenchOnAFixtureModule(t *testing.T) {
	testdaemon.Buildkit(t)
	module := fixture(t)
	before := snapshot(t, module)
	opts := options(t, module)

	report, files, err := bench.Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, retried := range report.Retried {
		t.Logf("failed once and run again: %s", retried)
	}
	if after := snapshot(t, module); !mapsEqual(before, after) {
		t.Error("the fixture was not restored after the edit scenarios")
	}
	if report.OneBinaryEdit != "internal/onlyalpha" || report.SharedEdit != "internal/shared" {
		t.Errorf("edits picked %q and %q, want internal/onlyalpha and internal/shared", report.OneBinaryEdit, report.SharedEdit)
	}

	var fromDisk bench.Report
	data, err := os.ReadFile(filepath.Join(opts.Out, "latest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &fromDisk); err != nil {
		t.Fatalf("latest.json: %v", err)
	}
	want := []string{bench.NativeCold, bench.KilnCold, bench.NativeWarm, bench.KilnColdMounts, bench.KilnWarm,
		bench.NativeOneBinary, bench.KilnOneBinary, bench.NativeShared, bench.KilnShared,
		bench.KilnFreshLayers, bench.KilnFreshSnapshot,
		bench.NativeCgoSplit, bench.NativeCgoUniform}
	var names []string
	for _, s := range fromDisk.Scenarios {
		names = append(names, s.Name)
		if len(s.Runs) != 1 || s.Median <= 0 {
			t.Errorf("%s: runs %v", s.Name, s.Runs)
		}
		if s.Kind == "kiln" && (s.Ratio <= 0 || s.Ran+s.Reused == 0) {
			t.Errorf("%s: ratio %v, steps %d/%d", s.Name, s.Ratio, s.Ran, s.Ran+s.Reused)
		}
		// A kiln run took turns with the native run of its round.
		if native := fromDisk.Scenario(s.Baseline); native != nil && native.Kind == "native" && (len(s.RoundRatios) != 1 || s.RoundRatios[0] != float64(s.Runs[0])/float64(native.Runs[0])) {
			t.Errorf("%s: round ratios %v against %s's runs %v", s.Name, s.RoundRatios, native.Name, native.Runs)
		}
	}
	if !slices.Equal(names, want) {
		t.Errorf("scenarios %v, want %v", names, want)
	}
	if m := fromDisk.Machine; m.Cores == 0 || m.Memory == 0 || m.HostGo == "" || m.BuildKit == "" || m.KilnCommit == "" {
		t.Errorf("machine facts incomplete: %+v", m)
	}
	if s := fromDisk.Scenario(bench.KilnOneBinary); !slices.Contains(s.StepsRan, "[linux/amd64] go build") || !slices.Equal(s.Sent, []string{"linux_amd64/alpha"}) {
		t.Errorf("after an alpha-only edit, steps that ran: %v; binaries sent: %v, want alpha alone", s.StepsRan, s.Sent)
	}
	if s := fromDisk.Scenario(bench.KilnFreshSnapshot); !slices.Contains(s.StepsRan, "[go cache] seed GOCACHE from the snapshot") {
		t.Errorf("the fresh daemon did not seed its Go cache from the snapshot; steps that ran: %v", s.StepsRan)
	}
	if s := fromDisk.Scenario(bench.KilnFreshLayers); !slices.Contains(s.StepsRan, "[linux/amd64] go build") {
		t.Errorf("fresh daemon with the layer cache: steps that ran: %v", s.StepsRan)
	}
	if fromDisk.ModuleDownload != "in neither: the standard library only" {
		t.Errorf("module download: %q", fromDisk.ModuleDownload)
	}
	// Where the memory goes: the native build's go command and its compiles
	// are read apart; kiln's daemon tree is only when kiln manages the daemon.
	if s := fromDisk.Scenario(bench.NativeCold); s.PeakByProcess[measure.GroupGo] <= 0 || s.PeakByProcess[measure.GroupCompile] <= 0 {
		t.Errorf("native cold: peak memory by process %v lacks go or compile", s.PeakByProcess)
	}
	if s := fromDisk.Scenario(bench.KilnCold); fromDisk.Machine.DaemonMeasured && (s.PeakByProcess[measure.GroupBuildkitd] <= 0 || s.PeakByProcess[measure.GroupClient] <= 0) {
		t.Errorf("kiln cold: peak memory by process %v lacks buildkitd or the client", s.PeakByProcess)
	}
	// The machine's memory is read for both sides: the rise of used
	// memory, which counts tmpfs, where the resident sets cannot. A rise of
	// 0 is a reading: in CI another test package frees memory meanwhile,
	// and this fixture's native build is small (seen once in CI).
	for _, name := range []string{bench.NativeCold, bench.KilnCold} {
		if s := fromDisk.Scenario(name); s.SystemMemory < 0 || s.Tmpfs < 0 {
			t.Errorf("%s: system memory %d, tmpfs %d; want both read", name, s.SystemMemory, s.Tmpfs)
		}
	}
	// The steps (go and its compiles) take most of a cold build's CPU; the
	// daemon's own share is read apart from them.
	if s := fromDisk.Scenario(bench.KilnCold); fromDisk.Machine.DaemonMeasured && (s.CPUByProcess[measure.CPUSteps] <= s.CPUByProcess[measure.CPUDaemon] || s.CPUByProcess[measure.CPUClient] <= 0) {
		t.Errorf("kiln cold: CPU by process %v: want the steps' above the daemon's, and the client's", s.CPUByProcess)
	}
	if md, err := os.ReadFile(filepath.Join(opts.Out, "report.md")); err != nil || !strings.Contains(string(md), "Peak memory by process group") || !strings.Contains(string(md), "Memory as the machine feels it") || fromDisk.Machine.DaemonMeasured && !strings.Contains(string(md), "CPU of kiln's builds by part") {
		t.Errorf("report.md has no memory or CPU breakdown (%v)", err)
	}
	if fromDisk.CgoSplitRatio <= 0 {
		t.Error("no cgo split ratio")
	}

	md, err := os.ReadFile(filepath.Join(opts.Out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range want {
		if !strings.Contains(string(md), "| "+name+" |") {
			t.Errorf("report.md has no row for %s", name)
		}
	}
	svg, err := os.ReadFile(filepath.Join(opts.Out, "chart.svg"))
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(strings.NewReader(string(svg)))
	for {
		if _, err := dec.Token(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("chart.svg is not well-formed: %v", err)
		}
	}
	if !strings.Contains(string(svg), bench.KilnOneBinary) {
		t.Error("chart.svg does not show the incremental scenario")
	}
	if len(files) != 4 {
		t.Errorf("files written: %v", files)
	}
}

func TestBenchRestoresTheTreeWhenInterrupted(t *testing.T) {
	testdaemon.Buildkit(t)
	module := fixture(t)
	before := snapshot(t, module)
	opts := options(t, module)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	edited := ""
	opts.OnEdit = func(path string) {
		edited = path
		cancel()
	}
	_, _, err := bench.Run(ctx, opts)
	if err == nil {
		t.Fatal("an interrupted run succeeded")
	}
	if edited == "" {
		t.Fatal("no edit happened before the interruption")
	}
	if after := snapshot(t, module); !mapsEqual(before, after) {
		t.Errorf("%s was not restored after the interruption", edited)
	}
	if _, err := os.Stat(filepath.Join(opts.Out, "restore.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("restore.json left behind: %v", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestARetriedScenarioIsReported: a scenario run again after a failure is
// named in both reports, with the failure.
func TestARetriedScenarioIsReported(t *testing.T) {
	r := &bench.Report{Retried: []string{"scenario 6 of 12: [go] build kilnstep failed:"}}
	var table, md bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{"table": table.String(), "markdown": md.String()} {
		if !strings.Contains(out, "run again from its start: scenario 6 of 12: [go] build kilnstep failed:") {
			t.Errorf("the %s does not name the retried scenario:\n%s", name, out)
		}
	}
}

// TestOnlyRunsTheNamedGroups: -only=cgo runs the cgo experiment's two
// native builds and nothing else, and both reports say so; a group that
// does not exist is refused before anything runs.
func TestOnlyRunsTheNamedGroups(t *testing.T) {
	module := fixture(t)
	opts := options(t, module)
	opts.Only = []string{"cold", "nodes"}
	if _, _, err := bench.Run(context.Background(), opts); err == nil || !strings.Contains(err.Error(), `-only: no scenario group "nodes"`) || !strings.Contains(err.Error(), "cold, noop, kept, edits, fresh, cgo") {
		t.Errorf("-only=cold,nodes: %v", err)
	}
	if entries, _ := os.ReadDir(opts.Out); len(entries) != 0 {
		t.Errorf("a refused -only wrote %v", entries)
	}

	testdaemon.Buildkit(t)
	opts.Only = []string{"cgo"}
	report, _, err := bench.Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	names := scenarioNames(report)
	if want := []string{bench.NativeCgoSplit, bench.NativeCgoUniform}; !slices.Equal(names, want) {
		t.Errorf("-only=cgo ran %v, want %v", names, want)
	}
	var table bytes.Buffer
	report.WriteTable(&table)
	md, err := os.ReadFile(filepath.Join(opts.Out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "only the scenarios of cgo (-only)") || !strings.Contains(string(md), "Only the scenarios of cgo (-only)") {
		t.Errorf("the reports do not say only cgo ran:\n%s\n%s", table.String(), md)
	}
}

// TestDaemonsProjection: the daemons group deals the platforms as a spread
// build does, times each node's share alone and all of them side by side,
// and projects the longest node against one daemon.
func TestDaemonsProjection(t *testing.T) {
	testdaemon.Buildkit(t)
	opts := options(t, fixture(t))
	opts.Build.Platforms, opts.Only, opts.Daemons = "linux/amd64,linux/arm64", []string{"daemons"}, 2
	report, _, err := bench.Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	names := scenarioNames(report)
	if want := []string{bench.KilnOneDaemon, "kiln cold, node 1 of 2 alone", "kiln cold, node 2 of 2 alone", bench.KilnSideBySide}; !slices.Equal(names, want) {
		t.Fatalf("-only=daemons ran %v, want %v", names, want)
	}
	// Each node built its own platform, and only it.
	platforms := []string{"linux/amd64", "linux/arm64"}
	for i, platform := range platforms {
		s, other := report.Scenarios[1+i], platforms[1-i]
		if !slices.Contains(s.StepsRan, "["+platform+"] go build") || slices.ContainsFunc(s.StepsRan, func(n string) bool { return strings.HasPrefix(n, "["+other+"]") }) {
			t.Errorf("%s ran %v, want %s's go build and not %s's", s.Name, s.StepsRan, platform, other)
		}
	}
	p := report.Projection
	if p == nil || p.Daemons != 2 || len(p.Nodes) != 2 || p.Nodes[1].Platforms[0] != "linux/arm64" {
		t.Fatalf("projection: %+v", p)
	}
	if p.CriticalPath != max(p.Nodes[0].Wall, p.Nodes[1].Wall) || p.OneDaemon != report.Scenarios[0].Median || p.Ratio != p.CriticalPath.Seconds()/p.OneDaemon.Seconds() || p.SideBySide <= 0 ||
		len(p.Rounds) != opts.Runs || p.Rounds[0] != p.Ratio {
		t.Errorf("projection figures do not add up: %+v", p)
	}
	md, err := os.ReadFile(filepath.Join(opts.Out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "## 2 machines: a projection") {
		t.Errorf("report.md has no projection:\n%s", md)
	}
}

func scenarioNames(r *bench.Report) []string {
	var names []string
	for _, s := range r.Scenarios {
		names = append(names, s.Name)
	}
	return names
}
