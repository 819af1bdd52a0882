// Package bench owns `mage bench`: it times kiln's builds (cold, warm,
// incremental) against native `go build` of the same binaries in one run,
// and reports the figures as tables, JSON, Markdown and a chart.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/log"
	"github.com/moby/buildkit/client"

	"github.com/kiln-build/kiln/internal/bench/measure"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/session"
)

// Options configure a bench run.
type Options struct {
	// Build selects what is built: this repository, or another module
	// through Build.Module and Build.Packages.
	Build session.Options
	// Runs is how often each scenario runs (default 3), but for the
	// fresh-daemon ones, the cgo experiment's and the daemons side by
	// side, which run once. Native
	// and kiln take turns, run by run, in every figure.
	Runs int
	// Out is where the reports go; <kiln>/_output/bench by default.
	Out string
	// Log receives progress lines; os.Stderr when nil.
	Log io.Writer
	// OnEdit, when set, is called after each source edit (tests use it to
	// interrupt a run midway).
	OnEdit func(path string)
	// Registry (HOST[:PORT]) holds the caches of the fresh-daemon
	// scenarios; REGISTRY, else a docker-registry on loopback, when empty.
	Registry string
	// Only names the groups of scenarios to run (Groups); every one but
	// daemons when empty. A group brings the cold runs whose state it
	// starts from.
	Only []string
	// Daemons is how many daemons the daemons group spreads the platforms
	// over (default 3).
	Daemons int
}

// Groups are the names Options.Only takes, each the scenarios of one
// figure of the report, with the cold runs they start from.
// The daemons group runs only when named: it starts daemons of its own
// and builds every platform cold twice each run (one daemon, the nodes)
// and once more side by side.
var Groups = []string{"cold", "noop", "kept", "edits", "fresh", "cgo", "daemons"}

// Scenario is one measured situation.
type Scenario struct {
	Name        string          `json:"name"`
	Kind        string          `json:"kind"` // native or kiln
	Description string          `json:"description"`
	Runs        []time.Duration `json:"runs"`
	Median      time.Duration   `json:"median"`
	Min         time.Duration   `json:"min"`
	Max         time.Duration   `json:"max"`
	// CPU is the median CPU time of the build processes; -1 if unreadable.
	CPU time.Duration `json:"cpu"`
	// PeakMemory is the largest resident memory of the build processes
	// (for kiln: the daemon and its children); -1 if unreadable.
	PeakMemory int64 `json:"peakMemory"`
	// SystemMemory is the largest rise of the machine's used memory
	// (MemTotal - MemAvailable) over a run, tmpfs included: the figure the
	// memory target applies to. Tmpfs is what tmpfs held at that peak, and
	// TmpfsMounts the build's tmpfs mounts then, by mount point. -1 if
	// unreadable.
	SystemMemory int64            `json:"systemMemory"`
	Tmpfs        int64            `json:"tmpfs"`
	TmpfsMounts  map[string]int64 `json:"tmpfsMounts,omitempty"`
	// PeakByProcess is the largest resident memory of each process group
	// (buildkitd, runc, go, compile, link, the kiln client, other); groups
	// peak at different times.
	PeakByProcess map[string]int64 `json:"peakByProcess,omitempty"`
	// CPUByProcess is a kiln scenario's median CPU time of the daemon
	// itself, of the steps it ran and of the client (which CPU leaves
	// out: in process, it shares the bench's own process).
	CPUByProcess map[string]time.Duration `json:"cpuByProcess,omitempty"`
	// GoCache is the size of the Go build cache after the scenario.
	GoCache int64 `json:"goCache"`
	// Ran and Reused count kiln's steps in the last run; StepsRan names the
	// steps that ran, and StepTimes says how long each took, start to end
	// (steps overlap, so they add up to more than the wall time).
	Ran       int                      `json:"ran"`
	Reused    int                      `json:"reused"`
	StepsRan  []string                 `json:"stepsRan,omitempty"`
	StepTimes map[string]time.Duration `json:"stepTimes,omitempty"`
	// Sent are the binaries the last run sent (relative to the output
	// folder): those whose bytes changed.
	Sent []string `json:"sent,omitempty"`
	// Baseline names the native scenario this one is compared with, and
	// Ratio is Median / that scenario's Median.
	Baseline string  `json:"baseline,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	// RoundRatios are each run against the native run it took turns with:
	// how far one round's ratio strays from the median's.
	RoundRatios []float64 `json:"roundRatios,omitempty"`
	Note        string    `json:"note,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	Cores          int    `json:"cores"`
	Memory         int64  `json:"memory"`
	HostGo         string `json:"hostGo"`
	Toolchain      string `json:"toolchain"`
	BuildKit       string `json:"buildkit"`
	KilnCommit     string `json:"kilnCommit"`
	DaemonMeasured bool   `json:"daemonMeasured"`
	// DeadMemoryCgroups is how many removed memory cgroups the kernel held
	// when the timing began (after the bench freed them, when it could)
	// and when it ended; -1 if unreadable. Hundreds slow every step.
	DeadMemoryCgroups    int  `json:"deadMemoryCgroups"`
	DeadMemoryCgroupsEnd int  `json:"deadMemoryCgroupsEnd"`
	FreedMemoryCgroups   bool `json:"freedMemoryCgroups,omitempty"`
}

// Report is one bench run.
type Report struct {
	Date      time.Time `json:"date"`
	Machine   Machine   `json:"machine"`
	Module    string    `json:"module"`
	Binaries  []string  `json:"binaries"`
	Platforms []string  `json:"platforms"`
	// OneBinaryEdit and SharedEdit are the packages the incremental
	// scenarios edit.
	// ModuleDownload says whether the cold scenarios download modules:
	// in both (native from an empty GOMODCACHE, kiln from empty cache
	// mounts) or in neither (vendored, or the standard library only).
	ModuleDownload string     `json:"moduleDownload"`
	OneBinaryEdit  string     `json:"oneBinaryEdit"`
	SharedEdit     string     `json:"sharedEdit"`
	Scenarios      []Scenario `json:"scenarios"`
	// CgoSplitRatio is the cgo-split build time over the uniform one, with
	// the seed's measurement beside it.
	CgoSplitRatio float64 `json:"cgoSplitRatio"`
	SeedCgoRatio  float64 `json:"seedCgoRatio"`
	// Retried names the scenarios that failed once and were run again
	// whole, with the error of the failed attempt.
	Retried []string `json:"retried,omitempty"`
	// Only names the groups run (-only); empty when every one ran.
	Only []string `json:"only,omitempty"`
	// Projection is the daemons group's, when it ran.
	Projection *Projection `json:"projection,omitempty"`
}

// seedCgoRatio is Antrea's 9m49s with the cgo split over 6m42s without.
const seedCgoRatio = 589.0 / 402.0

// Scenario returns the named scenario.
func (r *Report) Scenario(name string) *Scenario {
	for i := range r.Scenarios {
		if r.Scenarios[i].Name == name {
			return &r.Scenarios[i]
		}
	}
	return nil
}

// Scenario names, in the order they are reported (those of one figure
// take turns run by run).
const (
	NativeCold       = "native cold"
	KilnCold         = "kiln cold"
	NativeWarm       = "native warm no-op"
	KilnColdMounts   = "kiln cold, Go caches kept"
	KilnWarm         = "kiln warm no-op"
	NativeOneBinary  = "native incremental, one binary"
	KilnOneBinary    = "kiln incremental, one binary"
	NativeShared     = "native incremental, shared"
	KilnShared       = "kiln incremental, shared"
	NativeCgoSplit   = "native cgo split"
	NativeCgoUniform = "native cgo uniform"
)

type runner struct {
	opts    Options
	plan    *plan.Plan
	daemon  *buildkit.Daemon
	report  *Report
	edits   *editor
	started time.Time
	step    int
	steps   int
	log     io.Writer
	// nativeCache is the GOCACHE the native scenarios share, filled by the
	// cold one; nativeModCache their GOMODCACHE, empty before it, when the
	// build downloads modules at all.
	nativeCache, nativeModCache string
	// nativeOut is where the native builds write their binaries, as a
	// developer's bin folder: go relinks only what changed since.
	nativeOut string
	// registry holds the caches of the fresh-daemon scenarios; "" skips them.
	registry string
}

// Run measures every scenario and writes the reports.
func Run(ctx context.Context, opts Options) (*Report, []string, error) {
	if opts.Runs <= 0 {
		opts.Runs = 3
	}
	for _, g := range opts.Only {
		if !slices.Contains(Groups, g) {
			return nil, nil, fmt.Errorf("-only: no scenario group %q; the groups are %s", g, strings.Join(Groups, ", "))
		}
	}
	opts.Build.Progress = "quiet"
	opts.Build.SkipChecks = true
	p, err := session.Plan(opts.Build)
	if err != nil {
		return nil, nil, err
	}
	kilnRoot := opts.Build.Root
	if kilnRoot == "" {
		if kilnRoot, err = os.Getwd(); err != nil {
			return nil, nil, err
		}
	}
	if opts.Out == "" {
		opts.Out = filepath.Join(kilnRoot, "_output", "bench")
	}
	if opts.Build.OutDir == "" {
		tmp, err := os.MkdirTemp("", "kiln-bench-out-")
		if err != nil {
			return nil, nil, err
		}
		defer os.RemoveAll(tmp)
		opts.Build.OutDir = tmp
	}
	r := &runner{opts: opts, plan: p, started: time.Now(), log: opts.Log}
	if r.log == nil {
		r.log = os.Stderr
	}
	r.edits, err = newEditor(opts.Out, p.Root)
	if err != nil {
		return nil, nil, err
	}
	defer r.edits.restore()
	defer func() {
		if r.nativeOut != "" {
			os.RemoveAll(r.nativeOut)
		}
		if r.nativeCache != "" {
			os.RemoveAll(r.nativeCache)
		}
		if r.nativeModCache != "" {
			os.RemoveAll(r.nativeModCache) // written with -modcacherw
		}
	}()

	d, err := managed.Connect(ctx, kilnRoot)
	if err != nil {
		return nil, nil, err
	}
	defer d.Close()
	r.daemon = d

	r.report = &Report{Date: time.Now().UTC(), Module: p.Module, Platforms: p.PlatformIDs(), SeedCgoRatio: seedCgoRatio}
	for _, b := range p.Binaries {
		r.report.Binaries = append(r.report.Binaries, b.Name)
	}
	r.report.Machine = machine(ctx, d, p, kilnRoot)
	// Kiln's tools (the toolchain, kilnstep, git) are made and laid out in
	// the daemon before anything is timed: kiln cold keeps them, as native
	// keeps the installed Go.
	s, err := session.Start(ctx, opts.Build)
	if err != nil {
		return nil, nil, err
	}
	err = s.LayOutTools(ctx)
	s.Close()
	if err != nil {
		return nil, nil, err
	}
	registry, stopRegistry, err := benchRegistry(opts.Registry)
	if err != nil {
		return nil, nil, err
	}
	defer stopRegistry()
	r.registry = registry
	r.report.OneBinaryEdit, r.report.SharedEdit = pickEdits(p)
	switch {
	case p.ModMode == "vendor":
		r.report.ModuleDownload = "in neither: modules come from vendor/"
	case len(p.Modules) == 0:
		r.report.ModuleDownload = "in neither: the standard library only"
	default:
		r.report.ModuleDownload = fmt.Sprintf("in both: %d modules; native cold starts from an empty GOMODCACHE, kiln cold from empty cache mounts", len(p.Modules))
	}

	r.freeDeadMemoryCgroups()
	only := func(group string) bool { return len(opts.Only) == 0 || slices.Contains(opts.Only, group) }
	// Each scenario with the groups that run it, in the order they run.
	all := []struct {
		run    func(context.Context) error
		groups []string
	}{
		{r.cold, []string{"cold", "noop", "kept", "edits"}},
		{r.warm(only("noop"), only("kept")), []string{"noop", "kept"}},
		{r.incremental(NativeOneBinary, KilnOneBinary, r.report.OneBinaryEdit), []string{"edits"}},
		{r.incremental(NativeShared, KilnShared, r.report.SharedEdit), []string{"edits"}},
		{r.freshDaemon(KilnFreshLayers, false), []string{"fresh"}},
		{r.freshDaemon(KilnFreshSnapshot, true), []string{"fresh"}},
		{r.cgo, []string{"cgo"}},
		{r.daemons, []string{"daemons"}},
	}
	r.report.Only = opts.Only
	var scenarios []func(context.Context) error
	for _, sc := range all {
		if len(opts.Only) == 0 && !slices.Contains(sc.groups, "daemons") || slices.ContainsFunc(sc.groups, func(g string) bool { return slices.Contains(opts.Only, g) }) {
			scenarios = append(scenarios, sc.run)
		}
	}
	r.steps = len(scenarios)
	for _, sc := range scenarios {
		r.step++
		err := sc(ctx)
		if err != nil && ctx.Err() == nil {
			// A step failing inside BuildKit (a mount found empty) was
			// seen here when solves sharing steps ran at once in one job;
			// kiln no longer does that, and this stays as a safety net.
			// The scenario is run again from its start, so its figures are
			// still whole; the report says so, and a failure that repeats
			// ends the bench.
			if err := r.edits.restore(); err != nil {
				return nil, nil, err
			}
			first, _, _ := strings.Cut(err.Error(), "\n")
			log.G(ctx).Warnf("bench: scenario %d failed (%s); running it again", r.step, first)
			r.report.Retried = append(r.report.Retried, fmt.Sprintf("scenario %d of %d: %s", r.step, r.steps, first))
			err = sc(ctx)
		}
		if err != nil {
			return nil, nil, err
		}
		if err := r.edits.restore(); err != nil {
			return nil, nil, err
		}
	}
	r.ratios()
	r.report.Machine.DeadMemoryCgroupsEnd = measure.DeadMemoryCgroups()
	files, err := write(r.report, opts.Out)
	return r.report, files, err
}

// deadCgroupsToFree is how many dead memory cgroups the bench frees
// before timing anything: a day of builds left about 400, and with them
// this repository's kiln cold took 20% more CPU; a build leaves a few.
const deadCgroupsToFree = 50

// freeDeadMemoryCgroups drops the page cache when the kernel holds many
// dead memory cgroups and the bench may (as root), and otherwise says how
// to; the report gives the count either way.
func (r *runner) freeDeadMemoryCgroups() {
	m := &r.report.Machine
	m.DeadMemoryCgroups = measure.DeadMemoryCgroups()
	if m.DeadMemoryCgroups < deadCgroupsToFree {
		return
	}
	was := m.DeadMemoryCgroups
	if err := measure.DropPageCache(); err != nil {
		fmt.Fprintf(r.log, "bench: the kernel holds %d dead memory cgroups, which slow every step (kiln's most); they could not be freed (%v): run `sync; echo 3 | sudo tee /proc/sys/vm/drop_caches` before a bench\n", was, err)
		return
	}
	m.DeadMemoryCgroups, m.FreedMemoryCgroups = measure.DeadMemoryCgroups(), true
	fmt.Fprintf(r.log, "bench: dropped the page cache to free %d dead memory cgroups, which slow every step (%d left)\n", was, m.DeadMemoryCgroups)
}

func (r *runner) progress(name string, run, of int) {
	fmt.Fprintf(r.log, "bench [%d/%d] %s, run %d/%d (elapsed %s)\n", r.step, r.steps, name, run, of, time.Since(r.started).Round(time.Second))
}

func (r *runner) add(s Scenario, samples []measure.Sample) {
	for _, x := range samples {
		s.Runs = append(s.Runs, x.Wall)
	}
	s.Median, s.Min, s.Max = stats(s.Runs)
	cpus := []time.Duration{}
	s.PeakMemory, s.SystemMemory, s.Tmpfs = -1, -1, -1
	for _, x := range samples {
		if x.System > s.SystemMemory {
			s.SystemMemory, s.Tmpfs, s.TmpfsMounts = x.System, x.Tmpfs, x.TmpfsMounts
		}
		if x.CPU >= 0 {
			cpus = append(cpus, x.CPU)
		}
		s.PeakMemory = max(s.PeakMemory, x.PeakRSS)
		for g, n := range x.Peaks {
			if s.PeakByProcess == nil {
				s.PeakByProcess = map[string]int64{}
			}
			s.PeakByProcess[g] = max(s.PeakByProcess[g], n)
		}
	}
	s.CPU = -1
	if len(cpus) > 0 {
		s.CPU, _, _ = stats(cpus)
	}
	byGroup := map[string][]time.Duration{}
	for _, x := range samples {
		for g, d := range x.CPUBy {
			byGroup[g] = append(byGroup[g], d)
		}
	}
	for g, ds := range byGroup {
		if s.CPUByProcess == nil {
			s.CPUByProcess = map[string]time.Duration{}
		}
		s.CPUByProcess[g], _, _ = stats(ds)
	}
	r.report.Scenarios = append(r.report.Scenarios, s)
}

func maxPeaks(a, b map[string]int64) map[string]int64 {
	if a == nil {
		a = map[string]int64{}
	}
	for g, n := range b {
		a[g] = max(a[g], n)
	}
	return a
}

func stats(ds []time.Duration) (median, lo, hi time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[0], s[len(s)-1]
}

// goEnv is the host environment of the native builds: the same Go
// environment kiln uses, for one target platform.
func (r *runner) goEnv(gocache string, target string, cgo string) []string {
	env := os.Environ()
	env = append(env, "GOCACHE="+gocache, "CGO_ENABLED="+cgo, "GOFLAGS=-modcacherw -mod="+r.plan.ModMode, "GOWORK=off")
	if r.nativeModCache != "" {
		env = append(env, "GOMODCACHE="+r.nativeModCache)
	}
	plat, _ := config.ParsePlatform(target)
	return append(env, plan.TargetEnv(plat)...)
}

// nativeBuildArgs are the build flags as the configuration gives them, as
// a developer types them: without the one kiln adds (plan.NoDWARF), which
// is part of kiln's cost, not of native go build's.
func (r *runner) nativeBuildArgs() []string {
	return slices.DeleteFunc(slices.Clone(r.plan.GoEnv.BuildArgs), func(a string) bool { return a == plan.NoDWARF })
}

// nativeBuild builds every binary for every platform on the host, one go
// command per platform into the same folder every time, as a developer
// would: go relinks only the binaries whose build ID is out of date.
func (r *runner) nativeBuild(ctx context.Context) (measure.Sample, error) {
	if r.nativeOut == "" {
		var err error
		if r.nativeOut, err = os.MkdirTemp("", "kiln-bench-native-"); err != nil {
			return measure.Sample{}, err
		}
	}
	out := r.nativeOut
	var total measure.Sample
	for _, target := range r.plan.PlatformIDs() {
		args := append([]string{"build"}, r.nativeBuildArgs()...)
		args = append(args, "-o", filepath.Join(out, strings.ReplaceAll(target, "/", "_"))+"/")
		for _, b := range r.plan.Binaries {
			args = append(args, b.Package)
		}
		s, err := measure.RunCommand(ctx, r.plan.Root, r.goEnv(r.nativeCache, target, "0"), "go", args...)
		if err != nil {
			return measure.Sample{}, err
		}
		total.Wall += s.Wall
		total.CPU += s.CPU
		total.PeakRSS = max(total.PeakRSS, s.PeakRSS)
		total.AddSystem(s)
		total.Peaks = maxPeaks(total.Peaks, s.Peaks)
	}
	return total, nil
}

// contender is one side of a figure: the scenario it reports and one run
// of it. Native runs return no steps.
type contender struct {
	sc  Scenario
	run func(context.Context) (measure.Sample, buildkit.Steps, error)
}

// turns runs every contender once per round, -runs rounds, after prepare
// (an edit) when set. Native and kiln take turns, so that the machine's
// drift over the minutes a figure takes (10-30% within an hour was seen on
// a 2-core machine) weighs on a ratio's two sides alike, and every other
// round in the reverse order, so that neither side always runs second,
// after the other's writes.
func (r *runner) turns(ctx context.Context, prepare func(round int) error, cs ...contender) error {
	samples := make([][]measure.Sample, len(cs))
	steps := make([]buildkit.Steps, len(cs))
	for i := 1; i <= r.opts.Runs; i++ {
		if prepare != nil {
			if err := prepare(i); err != nil {
				return err
			}
		}
		for _, j := range roundOrder(len(cs), i) {
			c := cs[j]
			r.progress(c.sc.Name, i, r.opts.Runs)
			settle()
			s, st, err := c.run(ctx)
			if err != nil {
				return err
			}
			samples[j], steps[j] = append(samples[j], s), st
		}
	}
	for j, c := range cs {
		sc := c.sc
		if sc.Kind == "kiln" {
			r.describe(&sc, steps[j], samples[j][len(samples[j])-1].Sent)
		} else {
			sc.GoCache = measure.DirSize(r.nativeCache)
		}
		r.add(sc, samples[j])
	}
	return nil
}

// settle writes back what the file systems hold dirty before a timed run
// (every kiln build, every native one), so that no run pays for the one
// before it: after a native edit build,
// 100 MB of its binaries were dirty here, and the first fsync of kiln's
// daemon (ext4, data=ordered) waited for them; sync took 84 ms.
func settle() { syscall.Sync() }

// roundOrder is the order n contenders run in on round (from 1): as given
// on odd rounds, reversed on even ones.
func roundOrder(n, round int) []int {
	order := make([]int, n)
	for j := range order {
		order[j] = j
	}
	if round%2 == 0 {
		slices.Reverse(order)
	}
	return order
}

// native is a native build as a contender's run.
func native(build func(context.Context) (measure.Sample, error)) func(context.Context) (measure.Sample, buildkit.Steps, error) {
	return func(ctx context.Context) (measure.Sample, buildkit.Steps, error) {
		s, err := build(ctx)
		return s, nil, err
	}
}

func (r *runner) cold(ctx context.Context) error {
	desc := "go build on the host, empty GOCACHE and output folder"
	if len(r.plan.Modules) > 0 {
		desc = "go build on the host, empty GOCACHE, GOMODCACHE and output folder"
	}
	if slices.Contains(r.plan.GoEnv.BuildArgs, plan.NoDWARF) {
		desc += "; the configuration's flags as typed, without the " + plan.NoDWARF + " kiln adds as the link drops DWARF"
	}
	return r.turns(ctx, nil,
		contender{Scenario{Name: NativeCold, Kind: "native", Description: desc}, native(r.nativeColdRun)},
		contender{Scenario{Name: KilnCold, Kind: "kiln", Description: "BuildKit state emptied but for the tools (the unpacked toolchain, kilnstep, git, the CA bundle), as the host keeps Go installed for native: no cache mounts, no module, source or output layers", Baseline: NativeCold},
			func(ctx context.Context) (measure.Sample, buildkit.Steps, error) {
				return r.kilnPrunedBuild(ctx, pruneAllButTools)
			}})
}

// nativeColdRun builds natively from an empty GOCACHE and output folder,
// and an empty GOMODCACHE when there are modules to download: kiln's cold
// build starts from empty cache mounts and downloads them, so the native
// one downloads them as well. The native scenarios after it use what the
// last run filled.
func (r *runner) nativeColdRun(ctx context.Context) (measure.Sample, error) {
	for _, dir := range []string{r.nativeCache, r.nativeModCache, r.nativeOut} {
		if dir != "" {
			if err := os.RemoveAll(dir); err != nil { // GOMODCACHE is written with -modcacherw
				return measure.Sample{}, err
			}
		}
	}
	r.nativeCache, r.nativeModCache, r.nativeOut = "", "", ""
	settle()
	var err error
	if r.nativeCache, err = os.MkdirTemp("", "kiln-bench-gocache-"); err != nil {
		return measure.Sample{}, err
	}
	if len(r.plan.Modules) > 0 {
		if r.nativeModCache, err = os.MkdirTemp("", "kiln-bench-gomodcache-"); err != nil {
			return measure.Sample{}, err
		}
	}
	return r.nativeBuild(ctx)
}

// warm times native's no-op against kiln's no-op and kiln's build after
// `mage buildkit:prune`, each kiln run of the latter after a prune of its
// own. Such a build takes about as long as native's warm no-op, the
// baseline of both.
func (r *runner) warm(noop, kept bool) func(context.Context) error {
	return func(ctx context.Context) error {
		cs := []contender{{Scenario{Name: NativeWarm, Kind: "native", Description: "go build again into the same folder, nothing changed (links nothing)"},
			native(r.nativeBuild)}}
		if kept {
			cs = append(cs, contender{Scenario{Name: KilnColdMounts, Kind: "kiln", Description: "layers pruned, Go cache mounts and local transfer state kept (a developer after `mage buildkit:prune`)", Baseline: NativeWarm},
				func(ctx context.Context) (measure.Sample, buildkit.Steps, error) {
					return r.kilnPrunedBuild(ctx, pruneUnkept)
				}})
		}
		if noop {
			cs = append(cs, contender{Scenario{Name: KilnWarm, Kind: "kiln", Description: "nothing changed", Baseline: NativeWarm}, r.kilnBuild})
		}
		return r.turns(ctx, nil, cs...)
	}
}

// incremental times native and kiln after the same edit to pkg, each round
// a new one.
func (r *runner) incremental(nativeName, kilnName, pkg string) func(context.Context) error {
	return func(ctx context.Context) error {
		if pkg == "" {
			for _, sc := range []Scenario{{Name: nativeName, Kind: "native"}, {Name: kilnName, Kind: "kiln"}} {
				sc.Note = "no such package in this module"
				r.report.Scenarios = append(r.report.Scenarios, sc)
			}
			return nil
		}
		edit := func(round int) error { return r.edit(pkg, round) }
		return r.turns(ctx, edit,
			contender{Scenario{Name: nativeName, Kind: "native", Description: "go build after an edit to " + pkg},
				native(r.nativeBuild)},
			contender{Scenario{Name: kilnName, Kind: "kiln", Description: "after an edit to " + pkg, Baseline: nativeName}, r.kilnBuild})
	}
}

func (r *runner) edit(pkg string, n int) error {
	path, err := r.edits.edit(pkg, n)
	if err != nil {
		return err
	}
	if r.opts.OnEdit != nil {
		r.opts.OnEdit(path)
	}
	return nil
}

// kilnBuild runs `mage binaries` in process and measures it, with the
// daemon's CPU and memory when kiln manages it.
func (r *runner) kilnBuild(ctx context.Context) (measure.Sample, buildkit.Steps, error) {
	return r.kilnBuildWith(ctx, r.opts.Build)
}

func (r *runner) kilnBuildWith(ctx context.Context, opts session.Options) (measure.Sample, buildkit.Steps, error) {
	pid := func() int { return 0 }
	if r.daemon.Managed != nil {
		pid = func() int { p, _ := r.daemon.Managed.PID(); return p }
	}
	settle()
	selfBefore, childrenBefore, cpuOK := measure.ProcessCPU(pid())
	clientBefore := measure.SelfCPU()
	peak := measure.SamplePeak(pid, true)
	start := time.Now()
	out, err := session.Binaries(ctx, opts)
	wall := time.Since(start)
	rss, groups := peak.Stop()
	if err != nil {
		return measure.Sample{}, nil, err
	}
	s := measure.Sample{Wall: wall, CPU: -1, PeakRSS: -1}
	peak.System(&s)
	for _, f := range out.Sent {
		if rel, err := filepath.Rel(out.Dir, f); err == nil {
			s.Sent = append(s.Sent, rel)
		}
	}
	client := measure.SelfCPU() - clientBefore
	if self, children, ok := measure.ProcessCPU(pid()); ok && cpuOK {
		s.CPU = self - selfBefore + children - childrenBefore
		s.CPUBy = map[string]time.Duration{measure.CPUDaemon: self - selfBefore, measure.CPUSteps: children - childrenBefore, measure.CPUClient: client}
		s.PeakRSS, s.Peaks = rss, groups
	}
	return s, out.Steps, nil
}

// describe fills in what kiln's last run of a scenario did: the steps that
// ran and the binaries it sent.
func (r *runner) describe(s *Scenario, steps buildkit.Steps, sent []string) {
	s.Ran, s.Reused, s.StepsRan, s.StepTimes, s.Sent = 0, 0, nil, nil, sent
	for _, st := range steps {
		if st.Cached {
			s.Reused++
			continue
		}
		s.Ran++
		s.StepsRan = append(s.StepsRan, st.Name)
		if st.Duration > 0 {
			if s.StepTimes == nil {
				s.StepTimes = map[string]time.Duration{}
			}
			s.StepTimes[st.Name] = st.Duration
		}
	}
	s.GoCache = r.goCacheSize()
}

// goCacheSize is the size of kiln's Go build cache mount on the daemon.
func (r *runner) goCacheSize() int64 {
	usage, err := r.daemon.DiskUsage(context.Background(), client.WithFilter([]string{"type==" + string(client.UsageRecordTypeCacheMount)}))
	if err != nil {
		return -1
	}
	var n int64
	for _, u := range usage {
		if strings.Contains(u.Description, fmt.Sprintf("with id %q", r.plan.Cache.GoCache)) {
			n += u.Size
		}
	}
	return n
}

// What a prune before a timed build leaves of the daemon's state.
type pruneMode int

const (
	pruneAll         pruneMode = iota // a fresh daemon
	pruneAllButTools                  // a host with Go installed and an empty GOCACHE
	pruneUnkept                       // what `mage buildkit:prune` keeps
)

func (r *runner) prune(ctx context.Context, mode pruneMode) error {
	switch mode {
	case pruneAllButTools:
		return managed.PruneAllButTools(ctx, r.daemon, nil)
	case pruneUnkept:
		return managed.PruneUnkept(ctx, r.daemon, nil)
	}
	return r.daemon.Prune(ctx, nil, client.PruneAll)
}

// kilnPrunedBuild prunes the daemon as mode says and times a build.
func (r *runner) kilnPrunedBuild(ctx context.Context, mode pruneMode) (measure.Sample, buildkit.Steps, error) {
	if err := r.prune(ctx, mode); err != nil {
		return measure.Sample{}, nil, fmt.Errorf("prune: %w", err)
	}
	// The binaries written before are up to date; time the build anyway.
	opts := r.opts.Build
	opts.Rebuild = true
	return r.kilnBuildWith(ctx, opts)
}

// cgo times the seed experiment natively for the host platform: the first
// binary with CGO_ENABLED=0 and the others with cgo, against all without,
// each from an empty cache. kiln never builds with cgo.
func (r *runner) cgo(ctx context.Context) error {
	if _, err := exec.LookPath("gcc"); err != nil {
		r.report.Scenarios = append(r.report.Scenarios, Scenario{Name: NativeCgoSplit, Kind: "native", Note: "gcc not found: cgo experiment skipped"})
		return nil
	}
	host := "linux/" + runtime.GOARCH
	run := func(name string, split bool) (measure.Sample, error) {
		r.progress(name, 1, 1)
		dir, err := os.MkdirTemp("", "kiln-bench-gocache-")
		if err != nil {
			return measure.Sample{}, err
		}
		defer os.RemoveAll(dir)
		out, err := os.MkdirTemp("", "kiln-bench-cgo-")
		if err != nil {
			return measure.Sample{}, err
		}
		defer os.RemoveAll(out)
		var total measure.Sample
		settle()
		for i, b := range r.plan.Binaries {
			cgo := "0"
			if split && i > 0 {
				cgo = "1"
			}
			args := append([]string{"build"}, r.nativeBuildArgs()...)
			args = append(args, "-o", filepath.Join(out, b.Name), b.Package)
			s, err := measure.RunCommand(ctx, r.plan.Root, r.goEnv(dir, host, cgo), "go", args...)
			if err != nil {
				return measure.Sample{}, err
			}
			total.Wall += s.Wall
			total.CPU += s.CPU
			total.PeakRSS = max(total.PeakRSS, s.PeakRSS)
			total.AddSystem(s)
		}
		return total, nil
	}
	split, err := run(NativeCgoSplit, true)
	if err != nil {
		return err
	}
	uniform, err := run(NativeCgoUniform, false)
	if err != nil {
		return err
	}
	note := fmt.Sprintf("run natively for %s (kiln never builds with cgo): %s with CGO_ENABLED=0, the others with cgo, empty cache", host, r.plan.Binaries[0].Name)
	r.add(Scenario{Name: NativeCgoSplit, Kind: "native", Description: note}, []measure.Sample{split})
	r.add(Scenario{Name: NativeCgoUniform, Kind: "native", Description: "every binary with CGO_ENABLED=0, empty cache"}, []measure.Sample{uniform})
	if uniform.Wall > 0 {
		r.report.CgoSplitRatio = float64(split.Wall) / float64(uniform.Wall)
	}
	return nil
}

func (r *runner) ratios() {
	for i := range r.report.Scenarios {
		s := &r.report.Scenarios[i]
		if s.Baseline == "" {
			continue
		}
		b := r.report.Scenario(s.Baseline)
		if b == nil || b.Median <= 0 {
			continue
		}
		s.Ratio = float64(s.Median) / float64(b.Median)
		if b.Kind == "native" && len(b.Runs) == len(s.Runs) {
			for i, run := range s.Runs {
				s.RoundRatios = append(s.RoundRatios, float64(run)/float64(b.Runs[i]))
			}
		}
	}
}

func machine(ctx context.Context, d *buildkit.Daemon, p *plan.Plan, kilnRoot string) Machine {
	m := Machine{Cores: runtime.NumCPU(), Memory: measure.MemTotal(), Toolchain: "go" + p.Toolchain.GoVersion, DaemonMeasured: d.Managed != nil}
	if out, err := exec.Command("go", "env", "GOVERSION").Output(); err == nil {
		m.HostGo = strings.TrimSpace(string(out))
	}
	if info, err := d.Info(ctx); err == nil {
		m.BuildKit = info.BuildkitVersion.Version
	}
	cmd := exec.Command("git", "rev-parse", "HEAD")
	cmd.Dir = kilnRoot
	if out, err := cmd.Output(); err == nil {
		m.KilnCommit = strings.TrimSpace(string(out))
	}
	return m
}

// pickEdits chooses, from each binary's package files, a package only one
// binary uses (a library before a main package) and one every binary uses.
func pickEdits(p *plan.Plan) (oneBinary, shared string) {
	users := map[string]int{}
	mains := map[string]bool{}
	for _, b := range p.Binaries {
		mains[strings.TrimPrefix(b.Package, "./")] = true
		dirs := map[string]bool{}
		for _, f := range b.Files {
			if strings.HasSuffix(f, ".go") && !strings.HasSuffix(f, "_test.go") {
				dirs[filepath.Dir(f)] = true
			}
		}
		for d := range dirs {
			users[d]++
		}
	}
	var dirs []string
	for d := range users {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		switch {
		case users[d] == len(p.Binaries) && shared == "" && len(p.Binaries) > 1:
			shared = d
		case users[d] == 1 && !mains[d] && oneBinary == "":
			oneBinary = d
		}
	}
	if oneBinary == "" && len(p.Binaries) > 0 {
		oneBinary = strings.TrimPrefix(p.Binaries[0].Package, "./")
	}
	return oneBinary, shared
}

// editor appends a comment to one file of a package and restores it, also
// after an interrupted run: the originals are kept on disk until restored.
type editor struct {
	root   string
	backup string
	files  map[string][]byte
}

func newEditor(out, root string) (*editor, error) {
	e := &editor{root: root, backup: filepath.Join(out, "restore.json"), files: map[string][]byte{}}
	if data, err := os.ReadFile(e.backup); err == nil {
		if err := json.Unmarshal(data, &e.files); err != nil {
			return nil, fmt.Errorf("%s: %w (restore the edited files by hand, then delete it)", e.backup, err)
		}
		if len(e.files) > 0 {
			fmt.Fprintf(os.Stderr, "bench: restoring %d file(s) an interrupted run edited\n", len(e.files))
		}
		if err := e.restore(); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return e, nil
}

func (e *editor) edit(pkg string, n int) (string, error) {
	matches, _ := filepath.Glob(filepath.Join(e.root, pkg, "*.go"))
	var file string
	for _, m := range matches {
		if !strings.HasSuffix(m, "_test.go") {
			file = m
			break
		}
	}
	if file == "" {
		return "", fmt.Errorf("bench: no Go file in %s to edit", pkg)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	if _, saved := e.files[file]; !saved {
		e.files[file] = data
		if err := e.save(); err != nil {
			return "", err
		}
	} else {
		data = e.files[file]
	}
	// Code the linker keeps: each edit is a new binary, as a real one is.
	edited := append(slices.Clone(data), fmt.Sprintf("\nvar kilnBenchEdit = %d\n\nfunc init() { kilnBenchEdit++ }\n", n)...)
	return file, os.WriteFile(file, edited, 0o644)
}

func (e *editor) save() error {
	if err := os.MkdirAll(filepath.Dir(e.backup), 0o755); err != nil {
		return err
	}
	data, err := json.Marshal(e.files)
	if err != nil {
		return err
	}
	return os.WriteFile(e.backup, data, 0o644)
}

func (e *editor) restore() error {
	for file, data := range e.files {
		if err := os.WriteFile(file, data, 0o644); err != nil {
			return fmt.Errorf("restore %s: %w", file, err)
		}
		delete(e.files, file)
	}
	if err := os.Remove(e.backup); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// CopyFromModuleCache copies a module version from the Go module cache
// (downloading it first if needed) into a temporary, writable directory, so
// a large real module can be benchmarked without committing it; vendor
// runs go mod vendor in the copy (the vendored variant). The returned
// function removes the copy.
func CopyFromModuleCache(ctx context.Context, modVersion string, vendor bool) (string, func(), error) {
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", modVersion).Output()
	if err != nil {
		return "", nil, fmt.Errorf("go mod download %s: %w", modVersion, err)
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		return "", nil, fmt.Errorf("go mod download %s: %s", modVersion, info.Error)
	}
	dir, err := os.MkdirTemp("", "kiln-bench-module-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	err = filepath.WalkDir(info.Dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(info.Dir, path)
		dst := filepath.Join(dir, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, data, 0o644)
	})
	if err != nil {
		cleanup()
		return "", nil, err
	}
	if vendor {
		cmd := exec.CommandContext(ctx, "go", "mod", "vendor")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			cleanup()
			return "", nil, fmt.Errorf("go mod vendor in the copy of %s: %v\n%s", modVersion, err, out)
		}
	}
	return dir, cleanup, nil
}
