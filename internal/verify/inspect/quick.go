package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/uptodate"
)

// ImagePath is where `images` writes an image under imagesDir.
func ImagePath(imagesDir, name string) string {
	return filepath.Join(imagesDir, name+".oci.tar")
}

// In is where `images` wrote each image under imagesDir, for ReadImages.
func In(imagesDir string) func(name string) string {
	return func(name string) string { return ImagePath(imagesDir, name) }
}

// CheckedMarker holds the key of the images the quick checks last passed.
func CheckedMarker(imagesDir string) string { return filepath.Join(imagesDir, ".checked") }

// ReadImages reads the layout of every planned image, each at the path at
// gives, with the binaries each ships.
func ReadImages(p *plan.Plan, at func(name string) string) (map[string]*Layout, map[string][]string, error) {
	layouts := map[string]*Layout{}
	binaries := map[string][]string{}
	for _, img := range p.Images {
		l, err := ReadLayout(at(img.Name))
		if err != nil {
			return nil, nil, fmt.Errorf("%w; rebuild it with `mage images`", err)
		}
		layouts[img.Name] = l
		binaries[img.Name] = img.Binaries
	}
	return layouts, binaries, nil
}

// QuickChecksOnce runs QuickChecks unless the images with these digests
// (name and digest, in order) passed them before, by this kiln, with these
// budgets and allowances: a no-op build stays fast.
// The images are read where at says; the marker is kept in imagesDir.
func QuickChecksOnce(p *plan.Plan, imagesDir string, at func(name string) string, digests [][2]string) (*Report, error) {
	var key strings.Builder
	for _, d := range digests {
		fmt.Fprintf(&key, "%s %s\n", d[0], d[1])
	}
	for _, b := range slices.Sorted(maps.Keys(p.Budgets)) {
		fmt.Fprintf(&key, "budget %s %d\n", b, p.Budgets[b])
	}
	allow, _ := json.Marshal(AllowancesOf(p))
	exe, known := uptodate.ExecutableDigest()
	fmt.Fprintf(&key, "allow %s\nkiln %s\n", allow, exe)
	marker := CheckedMarker(imagesDir)
	if prev, err := os.ReadFile(marker); known && err == nil && string(prev) == key.String() {
		return &Report{}, nil
	}
	report, err := QuickChecks(p, at)
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

// QuickChecks are the cheap checks `mage images` runs after a build: static
// linking and budgets on the shipped file sizes.
func QuickChecks(p *plan.Plan, at func(name string) string) (*Report, error) {
	layouts, binaries, err := ReadImages(p, at)
	if err != nil {
		return nil, err
	}
	report := &Report{}
	StaticChecks(report, layouts, binaries)
	ImageChecks(report, layouts, AllowancesOf(p))
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
						c := BudgetCheck(b, name, int64(len(f.Data)), budget, nil)
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

// AllowancesOf is what each planned image may hold beyond the rules: root,
// with its reason, and setuid files, with theirs.
func AllowancesOf(p *plan.Plan) map[string]Allowances {
	out := map[string]Allowances{}
	for _, img := range p.Images {
		a := Allowances{RootReason: img.RootReason, Setuid: map[string]string{}}
		for _, su := range img.Setuid {
			a.Setuid[su.Path] = su.Reason
		}
		out[img.Name] = a
	}
	return out
}
