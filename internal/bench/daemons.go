package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kiln-build/kiln/internal/bench/measure"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/spread"
)

// Scenarios of the daemons group: the build's platforms spread over
// several daemons.
const (
	KilnOneDaemon  = "kiln cold, one daemon"
	KilnSideBySide = "kiln cold, daemons side by side on this machine"
)

// Projection is what N machines would give a cold build whose platforms
// are spread over N daemons, one per machine: each node's share built
// alone on this machine (a machine of its own), the longest of them the
// critical path. It is a projection: the nodes were not run apart.
type Projection struct {
	Daemons int `json:"daemons"`
	// OneDaemon is the cold build of every platform on one daemon.
	OneDaemon time.Duration   `json:"oneDaemon"`
	Nodes     []ProjectedNode `json:"nodes"`
	// CriticalPath is the longest node's wall time, and Ratio it over
	// OneDaemon: what N machines would take, against one (medians).
	// Rounds are each round's ratio: its longest node over its one daemon.
	CriticalPath time.Duration `json:"criticalPath"`
	Ratio        float64       `json:"ratio"`
	Rounds       []float64     `json:"rounds"`
	// SideBySide is the measured wall time of the N daemons building at
	// once on this machine, competing for its cores.
	SideBySide time.Duration `json:"sideBySide"`
}

// ProjectedNode is one daemon's share, built alone.
type ProjectedNode struct {
	Platforms []string      `json:"platforms"`
	Wall      time.Duration `json:"wall"`
	// Busy is the CPU time of the steps the node ran; -1 if unreadable.
	Busy time.Duration `json:"busy"`
}

// daemons times the build's platforms dealt to n daemons as a spread
// build deals them (spread.Deal): every platform on one emptied daemon;
// each node's share alone on the emptied bench daemon, as on a machine
// of its own; and the n shares at once on n fresh daemons here.
func (r *runner) daemons(ctx context.Context) (err error) {
	// Run again after a failure, the figure starts over: drop what the
	// failed attempt added.
	had := len(r.report.Scenarios)
	defer func() {
		if err != nil {
			r.report.Scenarios, r.report.Projection = r.report.Scenarios[:had], nil
		}
	}()
	n := r.opts.Daemons
	if n <= 0 {
		n = 3
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("node %d", i+1)
	}
	var shares [][]string
	for _, share := range spread.Deal(r.plan.PlatformIDs(), names, nil) {
		if len(share) > 0 {
			shares = append(shares, share)
		}
	}
	proj := &Projection{Daemons: len(shares)}
	if len(shares) < 2 {
		r.report.Scenarios = append(r.report.Scenarios, Scenario{Name: KilnOneDaemon, Kind: "kiln", Note: "one daemon's share holds every platform: nothing to spread (-platforms names several, -daemons=N two or more)"})
		return nil
	}

	// One daemon and the nodes take turns, round by round; the figures are
	// the medians, and each round's ratio is kept to show the noise.
	// Each scenario is described right after its last run: describe reads
	// the Go cache the build left.
	runs := max(r.opts.Runs, 1)
	var ones []measure.Sample
	oneSc := Scenario{Name: KilnOneDaemon, Kind: "kiln", Description: "empty BuildKit state, every platform (" + strings.Join(r.plan.PlatformIDs(), ", ") + ") on one daemon"}
	nodes := make([][]measure.Sample, len(shares))
	nodeScs := make([]Scenario, len(shares))
	for i, share := range shares {
		nodeScs[i] = Scenario{Name: nodeName(i, len(shares)), Kind: "kiln", Baseline: KilnOneDaemon,
			Description: "empty BuildKit state, " + strings.Join(share, ", ") + " only: this node's share, alone on the machine as on one of its own"}
	}
	for run := 1; run <= runs; run++ {
		r.progress(KilnOneDaemon, run, runs)
		one, steps, err := r.kilnPrunedBuild(ctx, pruneAll)
		if err != nil {
			return err
		}
		ones = append(ones, one)
		if run == runs {
			r.describe(&oneSc, steps, one.Sent)
		}
		longest := time.Duration(0)
		for i, share := range shares {
			name := nodeName(i, len(shares))
			r.progress(name, run, runs)
			if err := r.prune(ctx, pruneAll); err != nil {
				return fmt.Errorf("prune: %w", err)
			}
			opts := r.opts.Build
			opts.Platforms, opts.Rebuild = strings.Join(share, ","), true
			s, steps, err := r.kilnBuildWith(ctx, opts)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			nodes[i] = append(nodes[i], s)
			if run == runs {
				r.describe(&nodeScs[i], steps, s.Sent)
			}
			longest = max(longest, s.Wall)
		}
		proj.Rounds = append(proj.Rounds, longest.Seconds()/one.Wall.Seconds())
	}
	r.add(oneSc, ones)
	proj.OneDaemon = r.report.Scenarios[len(r.report.Scenarios)-1].Median
	for i, share := range shares {
		r.add(nodeScs[i], nodes[i])
		var busy []time.Duration
		for _, s := range nodes[i] {
			if d, ok := s.CPUBy[measure.CPUSteps]; ok {
				busy = append(busy, d)
			}
		}
		node := ProjectedNode{Platforms: share, Wall: r.report.Scenarios[len(r.report.Scenarios)-1].Median, Busy: -1}
		if len(busy) > 0 {
			node.Busy, _, _ = stats(busy)
		}
		proj.Nodes = append(proj.Nodes, node)
		proj.CriticalPath = max(proj.CriticalPath, node.Wall)
	}
	proj.Ratio = proj.CriticalPath.Seconds() / proj.OneDaemon.Seconds()

	r.progress(KilnSideBySide, 1, 1)
	wall, steps, err := r.sideBySide(ctx, shares)
	if err != nil {
		return fmt.Errorf("%s: %w", KilnSideBySide, err)
	}
	proj.SideBySide = wall
	sc := Scenario{Name: KilnSideBySide, Kind: "kiln", Baseline: KilnOneDaemon,
		Description: fmt.Sprintf("%d fresh daemons building their shares at once, competing for this machine's cores", len(shares))}
	r.describe(&sc, steps, nil)
	sc.GoCache = -1 // on daemons of their own, stopped by now
	r.add(sc, []measure.Sample{{Wall: wall, CPU: -1, PeakRSS: -1, System: -1}})
	r.report.Projection = proj
	return nil
}

// sideBySide starts a fresh daemon for each share and times the shares'
// cold builds at once, returning the steps of all.
func (r *runner) sideBySide(ctx context.Context, shares [][]string) (time.Duration, buildkit.Steps, error) {
	root, err := r.opts.Build.RootDir()
	if err != nil {
		return 0, nil, err
	}
	var daemons []*managed.Managed
	defer func() {
		for _, m := range daemons {
			m.Stop(context.Background())
			os.RemoveAll(m.Dir)
		}
	}()
	for range shares {
		m, err := managed.DefaultManaged(root)
		if err != nil {
			return 0, nil, err
		}
		// A short path: unix socket paths hold at most 108 bytes.
		if m.Dir, err = os.MkdirTemp("", "kiln-bench-bk-"); err != nil {
			return 0, nil, err
		}
		daemons = append(daemons, m)
		c, err := m.Ensure(ctx)
		if err != nil {
			return 0, nil, err
		}
		c.Close()
	}
	errs := make([]error, len(shares))
	outs := make([]*session.BinariesOutcome, len(shares))
	var wg sync.WaitGroup
	settle()
	start := time.Now()
	for i, share := range shares {
		opts := r.opts.Build
		opts.Daemon, opts.Platforms, opts.Rebuild = daemons[i].Address(), strings.Join(share, ","), true
		opts.OutDir = filepath.Join(daemons[i].Dir, "out")
		wg.Go(func() { outs[i], errs[i] = session.Binaries(ctx, opts) })
	}
	wg.Wait()
	wall := time.Since(start)
	var steps buildkit.Steps
	for i, err := range errs {
		if err != nil {
			return 0, nil, err
		}
		steps = steps.Plus(outs[i].Steps)
	}
	return wall, steps, nil
}

// nodeName names the scenario of node i of n.
func nodeName(i, n int) string { return fmt.Sprintf("kiln cold, node %d of %d alone", i+1, n) }

// writeProjection is the daemons group's projection, when it ran.
func writeProjection(w io.Writer, p *Projection) {
	if p == nil {
		return
	}
	fmt.Fprintf(w, "\n## %d machines: a projection\n\n", p.Daemons)
	fmt.Fprintf(w, "The platforms dealt to %d daemons as a spread build deals them, each node's share built cold and alone on this machine, as on a machine of its own:\n\n", p.Daemons)
	fmt.Fprintln(w, "| node | platforms | wall | busy (CPU of its steps) |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: |")
	for i, n := range p.Nodes {
		fmt.Fprintf(w, "| %d | %s | %s | %s |\n", i+1, strings.Join(n.Platforms, ", "), secs(n.Wall), secs(n.Busy))
	}
	var rounds []string
	for _, x := range p.Rounds {
		rounds = append(rounds, fmt.Sprintf("%.2f", x))
	}
	fmt.Fprintf(w, "\nProjected for %d machines: the critical path (the longest node) is %s, **%.2fx** one daemon's %s (medians; round by round %s). Measured here, the %d daemons side by side on one machine's cores took %s (%.2fx).\n",
		p.Daemons, secs(p.CriticalPath), p.Ratio, secs(p.OneDaemon), strings.Join(rounds, ", "), p.Daemons, secs(p.SideBySide), p.SideBySide.Seconds()/p.OneDaemon.Seconds())
}
