package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/log"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/verify"
)

// Doctor loads the configuration and returns every cache-drift finding,
// then, when there is none, resolves the plan and warns of stamp variables
// no binary can receive.
func Doctor(opts Options) ([]config.Finding, error) {
	root, err := opts.root()
	if err != nil {
		return nil, err
	}
	cfg, err := config.Load(root)
	if err != nil {
		return nil, err
	}
	if drift := cfg.Drift(); len(drift) > 0 {
		return drift, nil
	}
	p, err := Plan(opts)
	if err != nil {
		return nil, err
	}
	var out []config.Finding
	for _, v := range p.StampUnused {
		out = append(out, config.Finding{Kind: "stamp", Field: "stamp.variables." + v, Warning: true,
			Problem: fmt.Sprintf("no binary imports the package of %s, so the linker ignores it", v),
			Cost:    "the value is never stamped: the binaries report the variable's default",
			Fix:     "name a variable of a package the binaries import (go list -deps ./cmd/...), or remove it"})
	}
	return out, nil
}

// imagePath is where Images writes an image.
func imagePath(opts Options, p *plan.Plan, name string) string {
	return filepath.Join(opts.OutDirFor(p.Root), "images", name+".oci.tar")
}

// Verify runs the checks on what the last `mage images` produced, building
// first when nothing is there: cache drift, static linking of every binary
// in every image, and size budgets with what grew.
func Verify(ctx context.Context, opts Options) (*verify.Report, error) {
	report := &verify.Report{}
	findings, err := Doctor(opts)
	if err != nil {
		return nil, err
	}
	for _, f := range findings {
		report.Add(verify.Check{Check: "drift", Subject: f.Field, Detail: f.Problem + "; fix: " + f.Fix})
	}
	if len(findings) > 0 {
		return report, nil // nothing can be built until the drift is fixed
	}
	report.Add(verify.Check{Check: "drift", Subject: config.File, OK: true, Detail: "one Go environment for every binary"})

	p, err := Plan(opts)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, img := range p.Images {
		if _, err := os.Stat(imagePath(opts, p, img.Name)); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, img.Name)
		}
	}
	switch {
	case len(missing) == len(p.Images):
		log.G(ctx).Warn("no images under _output/images: building them first")
		if _, err := Images(ctx, opts); err != nil {
			return nil, err
		}
	case len(missing) > 0:
		return nil, fmt.Errorf("%s missing from %s: build them with `mage images`", strings.Join(missing, ", "), filepath.Join(opts.OutDirFor(p.Root), "images"))
	}
	layouts, binaries, err := readImages(opts, p)
	if err != nil {
		return nil, err
	}
	verify.StaticChecks(report, layouts, binaries)
	verify.ImageChecks(report, layouts, allowances(p))

	if len(p.Budgets) > 0 {
		sizes, err := Size(ctx, opts)
		if err != nil {
			return nil, err
		}
		for i := range sizes.Entries {
			e := &sizes.Entries[i]
			if e.Budget > 0 {
				report.Add(verify.BudgetCheck(e.Binary, e.Platform, e.Size, e.Budget, e))
			}
		}
	}
	return report, nil
}

func readImages(opts Options, p *plan.Plan) (map[string]*verify.Layout, map[string][]string, error) {
	layouts := map[string]*verify.Layout{}
	binaries := map[string][]string{}
	for _, img := range p.Images {
		l, err := verify.ReadLayout(imagePath(opts, p, img.Name))
		if err != nil {
			return nil, nil, fmt.Errorf("%w; rebuild it with `mage images`", err)
		}
		layouts[img.Name] = l
		binaries[img.Name] = img.Binaries
	}
	return layouts, binaries, nil
}

// quickChecksOnce runs quickChecks unless these exact images (by digest,
// with these budgets) passed them before: a no-op build stays fast.
func quickChecksOnce(opts Options, p *plan.Plan, images []ImageResult) (*verify.Report, error) {
	var key strings.Builder
	for _, img := range images {
		fmt.Fprintf(&key, "%s %s\n", img.Name, img.Digest)
	}
	for _, b := range slices.Sorted(maps.Keys(p.Budgets)) {
		fmt.Fprintf(&key, "budget %s %d\n", b, p.Budgets[b])
	}
	marker := checkedMarker(opts, p)
	if prev, err := os.ReadFile(marker); err == nil && string(prev) == key.String() {
		return &verify.Report{}, nil
	}
	report, err := quickChecks(opts, p)
	if err != nil {
		return nil, err
	}
	if report.Failed() == 0 {
		if err := atomicfile.Write(marker, func(f io.Writer) error { _, err := io.WriteString(f, key.String()); return err }); err != nil {
			return nil, err
		}
	}
	return report, nil
}

// checkedMarker holds the key of the images the quick checks last passed.
func checkedMarker(opts Options, p *plan.Plan) string {
	return filepath.Join(opts.OutDirFor(p.Root), "images", ".checked")
}

// quickChecks are the cheap checks `mage images` runs after a build: static
// linking and budgets on the shipped file sizes.
func quickChecks(opts Options, p *plan.Plan) (*verify.Report, error) {
	layouts, binaries, err := readImages(opts, p)
	if err != nil {
		return nil, err
	}
	report := &verify.Report{}
	verify.StaticChecks(report, layouts, binaries)
	verify.ImageChecks(report, layouts, allowances(p))
	seen := map[string]bool{}
	for _, name := range p.PlatformIDs() {
		for _, img := range p.Images {
			for _, m := range layouts[img.Name].Manifests {
				if m.Platform != name {
					continue
				}
				for _, b := range img.Binaries {
					budget, ok := p.Budgets[b]
					if !ok || seen[b+" "+name] {
						continue
					}
					seen[b+" "+name] = true
					if f, ok := m.File("usr/local/bin/" + b); ok {
						c := verify.BudgetCheck(b, name, int64(len(f.Data)), budget, nil)
						if !c.OK {
							c.Detail += "; `mage size` shows what grew"
						}
						report.Add(c)
					}
				}
			}
		}
	}
	return report, nil
}

func allowances(p *plan.Plan) map[string]verify.Allowances {
	out := map[string]verify.Allowances{}
	for _, img := range p.Images {
		a := verify.Allowances{RootReason: img.RootReason, Setuid: map[string]string{}}
		for _, su := range img.Setuid {
			a.Setuid[su.Path] = su.Reason
		}
		out[img.Name] = a
	}
	return out
}
