package session

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/plan"
)

// Options select what to build; the zero value builds everything configured.
type Options struct {
	// Root is the repository root; the working directory when empty.
	Root string
	// Platforms is a comma-separated platform list; PLATFORMS when empty,
	// then build/kiln.yaml.
	Platforms string
	// Stamp stamps version, commit and tree state (release builds).
	Stamp bool
	// Images limits the build to these images.
	Images []string
	// Progress is the progress mode; KILN_PROGRESS when empty, then auto.
	Progress string
	// OutDir is where outputs go; _output under Root when empty.
	OutDir string
	// SkipChecks skips the static and budget checks after `images`.
	SkipChecks bool
	// ProgressOut receives the progress display; os.Stderr when nil.
	ProgressOut io.Writer
	// CacheTo and CacheFrom override build/kiln.yaml's cache.to and
	// cache.from (BuildKit layer caches, e.g. type=registry,ref=…,mode=max).
	CacheTo, CacheFrom string
	// Module builds another Go module's main packages instead of this
	// repository's binaries: its directory, and Packages, its main packages
	// (e.g. ./cmd/buildkitd). The toolchain, platforms and cache ids still
	// come from this repository's build/kiln.yaml. Images are not built.
	Module   string
	Packages []string
	// GoCacheTo pushes a snapshot of the build's GOCACHE entries to this
	// repository (HOST[:PORT]/path) after a successful build; GoCacheFrom
	// seeds the daemon's GOCACHE from the best matching snapshot there.
	GoCacheTo, GoCacheFrom string
	// GoCacheMax caps a snapshot in bytes; gocache.DefaultMax when 0.
	GoCacheMax int64
	// TraceCompiles shows every package compiled (go -x) in the package steps.
	TraceCompiles bool
	// BinaryPlatforms are more platforms the binaries are built for beside
	// the images' (comma-separated; release assets).
	BinaryPlatforms string
	// Release builds what a release publishes. Unless TrustCaches, it
	// reads no cache at all: no layer cache is imported or exported, no Go
	// cache snapshot seeded or published, and every step re-runs, on an
	// empty Go cache of its own (Session.Isolated), whatever the daemon's
	// local cache holds.
	Release, TrustCaches bool
	// GoCacheKey overrides cache.gocacheKey: the cosign public key
	// (cosign.pub, or env://VAR) every seeded snapshot must be signed with.
	GoCacheKey string
	// GoCacheUnsigned seeds from snapshots no pinned key signed, as
	// cache.gocacheUnsigned does.
	GoCacheUnsigned bool
	// Daemon is the address of the BuildKit daemon to build on;
	// BUILDKIT_HOST when empty, then the managed local one.
	Daemon string
	// Part is set by package spread on the session of one daemon of a spread
	// build: its outcome carries the sources it read and its stamp.
	Part bool
	// SnapshotTargets are the platforms of the Go cache snapshot to seed
	// from, the build's when nil: package spread gives each daemon's part
	// the whole build's, whose snapshot a one-daemon build publishes.
	SnapshotTargets []string
	// RetryElsewhere, with several daemons, reruns the platforms of a
	// daemon that failed on one that finished (package spread).
	RetryElsewhere bool
	// Rebuild solves and writes the outputs even when the ones already
	// written were made from the same inputs (to time a build, or to fill a
	// pruned daemon's caches).
	Rebuild bool
}

// RootDir is the repository root the options build: Root, else the
// working directory.
func (o *Options) RootDir() (string, error) {
	if o.Root != "" {
		return filepath.Abs(o.Root)
	}
	return os.Getwd()
}

// Config loads kiln.yaml of the tree the options build.
func (o *Options) Config() (*config.Config, error) {
	root, err := o.RootDir()
	if err != nil {
		return nil, err
	}
	return config.Load(root)
}

func (o *Options) OutDirFor(root string) string {
	if o.OutDir != "" {
		return o.OutDir
	}
	return filepath.Join(root, "_output")
}

// ProgressMode is the progress display asked for: -progress, else
// KILN_PROGRESS, else BUILDKIT_PROGRESS, else auto.
func (o *Options) ProgressMode() (string, error) {
	mode, from := o.Progress, "-progress"
	// BUILDKIT_PROGRESS as buildx reads it, below kiln's own.
	for _, env := range []string{"KILN_PROGRESS", "BUILDKIT_PROGRESS"} {
		if mode == "" {
			mode, from = os.Getenv(env), env
		}
	}
	if mode == "" {
		return "auto", nil
	}
	for _, m := range buildkit.ProgressModes {
		if m == mode {
			return mode, nil
		}
	}
	return "", fmt.Errorf("%s: progress mode %q is unknown (use one of %s)", from, mode, strings.Join(buildkit.ProgressModes, ", "))
}

// Plan loads and validates the configuration and resolves the plan, without
// contacting BuildKit.
func Plan(opts Options) (*plan.Plan, error) {
	req, err := load(opts, nil)
	if err != nil {
		return nil, err
	}
	return plan.Resolve(req.root, req.cfg, req.po)
}

// request is what the user asked for, loaded and validated: the project
// root (or -module's), its configuration and the plan options.
type request struct {
	root string
	cfg  *config.Config
	po   plan.Options
}

func load(opts Options, head *plan.Git) (*request, error) {
	root, err := opts.RootDir()
	if err != nil {
		return nil, err
	}
	cfg, err := config.Load(root)
	if err != nil {
		return nil, err
	}
	if opts.Module != "" {
		if root, err = filepath.Abs(opts.Module); err != nil {
			return nil, err
		}
		if cfg, err = external(cfg, root, opts.Packages); err != nil {
			return nil, err
		}
	}
	po := plan.Options{Stamp: opts.Stamp, Images: opts.Images}
	cache, cacheErr := buildkit.CacheDir()
	if cacheErr == nil {
		po.ListCache = filepath.Join(cache, "golist")
	}
	// The host facts, read once: nothing after the plan runs git or go env.
	po.Host = plan.ReadHost(root, po.ListCache, opts.Stamp, head)
	if cacheErr == nil {
		// A plan without a daemon (`mage plan`) lists with the pinned go
		// when a build fetched it already.
		po.ListGo, _ = pinnedGo(context.Background(), cfg, hostPlatform(), cache, false, po.Host)
	}
	if opts.BinaryPlatforms != "" {
		if po.BinaryPlatforms, err = config.ParsePlatforms(opts.BinaryPlatforms); err != nil {
			return nil, fmt.Errorf("binary platforms: %w", err)
		}
	}
	list, source := opts.Platforms, "-platforms"
	if list == "" {
		list, source = os.Getenv("PLATFORMS"), "PLATFORMS"
	}
	if list != "" {
		if po.Platforms, err = config.ParsePlatforms(list); err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
	}
	return &request{root: root, cfg: cfg, po: po}, nil
}

// external is this repository's configuration applied to another module:
// its main packages become the binaries, and it has no images or stamping.
func external(cfg *config.Config, dir string, packages []string) (*config.Config, error) {
	_, modErr := os.Stat(filepath.Join(dir, "go.mod"))
	_, workErr := os.Stat(filepath.Join(dir, "go.work"))
	if modErr != nil && workErr != nil {
		return nil, fmt.Errorf("-module %s: no go.mod or go.work there; point it at a Go module's or workspace's root", dir)
	}
	if len(packages) == 0 {
		return nil, fmt.Errorf("-module %s: name its main packages with -packages, e.g. ./cmd/tool", dir)
	}
	ext := *cfg
	ext.Binaries, ext.Images, ext.Budgets = nil, nil, nil
	ext.Stamp = config.Stamp{}
	seen := map[string]bool{}
	for _, pkg := range packages {
		pkg = strings.TrimSpace(pkg)
		if !strings.HasPrefix(pkg, "./") {
			pkg = "./" + strings.TrimPrefix(pkg, "/")
		}
		name := path.Base(pkg)
		if seen[name] {
			return nil, fmt.Errorf("-packages: two packages named %s", name)
		}
		seen[name] = true
		ext.Binaries = append(ext.Binaries, config.Binary{Name: name, Package: pkg})
	}
	return &ext, nil
}
