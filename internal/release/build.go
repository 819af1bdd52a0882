package release

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/spread"
)

// built is what a release's build leaves for its signing: the images
// pushed and tagged, read back; each platform's image binaries (for the
// SBOMs) by platform, under tmp; the plan, and by image the toolchains
// that compiled its platforms.
type built struct {
	plan       *plan.Plan
	toolchains map[string][]plan.Toolchain
	pushed     []publish.PushResult
	bins       map[string]string
	tmp        string
}

// buildOnDaemon compiles the assets into work (when not ""), then pushes
// every image under its tags and exports their binaries, on one daemon.
func buildOnDaemon(ctx context.Context, prepared *session.Prepared, opts session.Options, ropts ReleaseOptions, assets []image.Asset, work, registry string) (*built, error) {
	s, err := prepared.Start(ctx)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if work != "" {
		if _, err := exportAssets(ctx, s, assets, work); err != nil {
			return nil, err
		}
	}
	// Read back: signing reads the registry with kiln's client anyway.
	pushed, err := publish.PushImages(ctx, s, registry, ropts.SkipTLSVerify, publish.Tags(s.Plan.Stamp.Version, ropts.Latest), true)
	if err != nil {
		return nil, err
	}
	tmp, err := binariesDir(opts.OutDirFor(s.Plan.Root))
	if err != nil {
		return nil, err
	}
	bins, err := exportImageBinaries(ctx, s, filepath.Join(tmp, "bin"))
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	toolchains := map[string][]plan.Toolchain{}
	for _, img := range s.Plan.Images {
		toolchains[img.Name] = []plan.Toolchain{s.Plan.Toolchain}
	}
	return &built{plan: s.Plan, toolchains: toolchains, pushed: pushed, bins: bins, tmp: tmp}, nil
}

// binariesDir is a new folder under the output folder for the binaries a
// release reads back: on the disk the release writes to, not in memory;
// a killed release's is swept by the next.
func binariesDir(out string) (string, error) {
	return atomicfile.Temp(filepath.Join(out, ".release"), true)
}

// buildSpread builds the release with its platforms spread over several
// daemons (spread.Split): each daemon compiles its share of the assets
// (dealAssets), pushes its platforms by digest and exports their binaries;
// once every daemon is done and every part read the same tree, the assets
// move into work and kiln pushes and tags the indexes (publish.PushIndexes),
// the same bytes one daemon pushes. The signing after it is the same.
func buildSpread(ctx context.Context, opts session.Options, ropts ReleaseOptions, p *plan.Plan, assets []image.Asset, work, registry string, hosts []string) (*built, error) {
	shares, err := spread.Split(opts, p, hosts)
	if err != nil {
		return nil, err
	}
	if len(shares) == 0 {
		return nil, fmt.Errorf("%s names %d daemons, and the release has no image to spread over them: name one daemon", buildkit.HostEnv, len(hosts))
	}
	tmp, err := binariesDir(opts.OutDirFor(p.Root))
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	dealt := dealAssets(assets, shares)
	type part struct {
		plan   *plan.Plan
		pushed []publish.PushResult
		bins   map[string]string
		assets []image.Asset
	}
	parts := make([]part, len(shares))
	reads := make([]spread.Read, len(shares))
	err = spread.Run(ctx, shares, hosts, ropts.RetryElsewhere, func(ctx context.Context, i int, sh spread.Share) error {
		dir := filepath.Join(tmp, strconv.Itoa(i))
		if err := os.RemoveAll(dir); err != nil { // a failed attempt's
			return err
		}
		s, err := session.Start(ctx, sh.Options)
		if err != nil {
			return err
		}
		defer s.Close()
		before := s.SourceDigests()
		mine := slices.Clone(dealt[i])
		if work != "" {
			if _, err := exportAssets(ctx, s, mine, filepath.Join(dir, "assets")); err != nil {
				return err
			}
		}
		pushed, err := publish.PushImages(ctx, s, registry, ropts.SkipTLSVerify, nil, false)
		if err != nil {
			return err
		}
		bins, err := exportImageBinaries(ctx, s, filepath.Join(dir, "bin"))
		if err != nil {
			return err
		}
		parts[i] = part{plan: s.Plan, pushed: pushed, bins: bins, assets: mine}
		reads[i], err = spread.ReadBy(sh, s, before)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := spread.SameTree(reads); err != nil {
		return nil, err
	}
	// The checks before the build (a dirty tree, the version) read p.
	if s := reads[0].Stamp; !reflect.DeepEqual(s, p.Stamp) {
		return nil, fmt.Errorf("the daemons were sent %s %s %s, and the release checked %s %s %s: the tree changed while they built it; release again",
			s.Version, s.Commit, s.TreeState, p.Stamp.Version, p.Stamp.Commit, p.Stamp.TreeState)
	}
	// The release's plan, with the modules the daemons' plans listed with
	// the pinned toolchain (as a one-daemon release's session lists them).
	signing := *p
	modules := map[string]bool{}
	for _, pt := range parts {
		for _, m := range pt.plan.Modules {
			modules[m] = true
		}
	}
	signing.Modules = slices.Sorted(maps.Keys(modules))
	b := &built{plan: &signing, toolchains: map[string][]plan.Toolchain{}, bins: map[string]string{}, tmp: tmp}
	var pushed []publish.PushResult
	if work != "" {
		os.RemoveAll(work) // a killed release's
		if err := os.MkdirAll(filepath.Dir(work), 0o755); err != nil {
			return nil, err
		}
		if err := os.Mkdir(work, 0o755); err != nil {
			return nil, err
		}
	}
	for i, pt := range parts {
		for _, img := range pt.plan.Images {
			if !slices.Contains(b.toolchains[img.Name], pt.plan.Toolchain) {
				b.toolchains[img.Name] = append(b.toolchains[img.Name], pt.plan.Toolchain)
			}
		}
		pushed = append(pushed, pt.pushed...)
		maps.Copy(b.bins, pt.bins)
		for _, a := range pt.assets {
			if err := os.Rename(filepath.Join(tmp, strconv.Itoa(i), "assets", a.Name), filepath.Join(work, a.Name)); err != nil {
				return nil, err
			}
			assets[slices.IndexFunc(assets, func(x image.Asset) bool { return x.Name == a.Name })].SHA256 = a.SHA256
		}
	}
	// In an order the dealing does not change: this machine's platform's
	// first, as a one-daemon release here records it.
	for _, tcs := range b.toolchains {
		slices.SortFunc(tcs, func(a, b plan.Toolchain) int {
			return cmp.Or(-cmp.Compare(boolInt(a == p.Toolchain), boolInt(b == p.Toolchain)), cmp.Compare(a.Module, b.Module))
		})
	}
	popts := ropts.PushOptions
	popts.ReadBack = true // signing reads the registry with kiln's client anyway
	if b.pushed, err = publish.PushIndexes(ctx, p, pushed, reads[0].Stamp.Version, popts, registry); err != nil {
		return nil, err
	}
	ok = true
	return b, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// dealAssets gives each share the assets of its platforms, and the assets
// of a platform no image has (a windows antctl) to the share with the
// fewest platforms, the first on a tie, all of one platform together: they
// share its compile.
func dealAssets(assets []image.Asset, shares []spread.Share) [][]image.Asset {
	dealt := make([][]image.Asset, len(shares))
	load := make([]int, len(shares))
	for i, sh := range shares {
		load[i] = len(sh.Platforms)
	}
	given := map[string]int{}
	for _, a := range assets {
		i, ok := given[a.Platform]
		if !ok {
			i = slices.IndexFunc(shares, func(sh spread.Share) bool { return slices.Contains(sh.Platforms, a.Platform) })
			if i < 0 {
				i = 0
				for j := range load {
					if load[j] < load[i] {
						i = j
					}
				}
				load[i]++
			}
			given[a.Platform] = i
		}
		dealt[i] = append(dealt[i], a)
	}
	return dealt
}
