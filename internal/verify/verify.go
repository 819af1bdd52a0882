// Package verify owns the verify stage's targets: verify (drift, static
// linking, image rules and size budgets of what the last build wrote),
// doctor, verify:repro (build twice, the second time in isolation, and
// locate every difference) and size. It starts the builds it checks through package session and
// judges them with package inspect.
package verify

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/log"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// Doctor loads the configuration and returns every cache-drift finding,
// then, when there is none, resolves the plan and warns of stamp variables
// no binary can receive.
func Doctor(opts session.Options) ([]config.Finding, error) {
	root, err := opts.RootDir()
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
	p, err := session.Plan(opts)
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

// Verify runs the checks on what the last `mage images` produced, building
// first when nothing is there: cache drift, static linking of every binary
// in every image, and size budgets with what grew.
func Verify(ctx context.Context, opts session.Options) (*inspect.Report, error) {
	report := &inspect.Report{}
	findings, err := Doctor(opts)
	if err != nil {
		return nil, err
	}
	for _, f := range findings {
		report.Add(inspect.Check{Check: "drift", Subject: f.Field, Detail: f.Problem + "; fix: " + f.Fix})
	}
	if len(findings) > 0 {
		return report, nil // nothing can be built until the drift is fixed
	}
	report.Add(inspect.Check{Check: "drift", Subject: config.File, OK: true, Detail: "one Go environment for every binary"})

	p, err := session.Plan(opts)
	if err != nil {
		return nil, err
	}
	// Its size report links on one daemon; refused before any build.
	if hosts := buildkit.Hosts(os.Getenv(buildkit.HostEnv)); len(hosts) > 1 {
		return nil, fmt.Errorf("%s names %d daemons; verify builds on one: name one", buildkit.HostEnv, len(hosts))
	}
	var missing []string
	for _, img := range p.Images {
		if _, err := os.Stat(inspect.ImagePath(session.ImagesDir(opts, p), img.Name)); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, img.Name)
		}
	}
	switch {
	case len(missing) == len(p.Images):
		log.G(ctx).Warn("no images under _output/images: building them first")
		// The full checks below report what the quick ones would refuse.
		build := opts
		build.SkipChecks = true
		if _, err := session.Images(ctx, build); err != nil {
			return nil, err
		}
	case len(missing) > 0:
		return nil, fmt.Errorf("%s missing from %s: build them with `mage images`", strings.Join(missing, ", "), filepath.Join(opts.OutDirFor(p.Root), "images"))
	}
	layouts, binaries, err := inspect.ReadImages(p, inspect.In(session.ImagesDir(opts, p)))
	if err != nil {
		return nil, err
	}
	inspect.StaticChecks(report, layouts, binaries)
	inspect.ImageChecks(report, layouts, inspect.AllowancesOf(p))

	if len(p.Budgets) > 0 {
		sizes, err := Size(ctx, opts)
		if err != nil {
			return nil, err
		}
		for i := range sizes.Entries {
			e := &sizes.Entries[i]
			if e.Budget > 0 {
				report.Add(inspect.BudgetCheck(e.Binary, e.Platform, e.Size, e.Budget, e))
			}
		}
	}
	return report, nil
}
