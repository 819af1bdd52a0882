// Package session owns one build's orchestration: it loads and checks the
// request, connects to BuildKit once, resolves the plan for the worker,
// assembles the graph (package image), solves it and writes the outputs
// (OCI layouts, binaries), keeping the records that let the next build
// skip work (no-op, up-to-date outputs, source digests: package uptodate)
// and the explain record; then it closes. Publishing (package publish) and
// the verify targets (package verify) build on its Session.
package session

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/containerd/log"
	"github.com/moby/buildkit/client"
	bksession "github.com/moby/buildkit/session"
	"github.com/moby/patternmatcher/ignorefile"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/explain"
	"github.com/kiln-build/kiln/internal/gocache"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/golang/vendorarchive"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/uptodate"
	"github.com/kiln-build/kiln/internal/verify/inspect"
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
	// Release builds what a release publishes: no layer cache is imported or
	// exported, no Go cache snapshot seeded or published, and the Go cache
	// mount is the release's own (<gocache>-release), unless TrustCaches.
	Release, TrustCaches bool
	// GoCacheKey overrides cache.gocacheKey: the ed25519 public key (PEM)
	// every seeded snapshot must be signed with.
	GoCacheKey string
	// Rebuild solves and writes the outputs even when the ones already
	// written were made from the same inputs (to time a build, or to fill a
	// pruned daemon's caches).
	Rebuild bool
}

// ReleaseCacheSuffix names a release's own Go cache mount: no build that
// read a shared cache wrote to it.
const ReleaseCacheSuffix = "-release"

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

func (o *Options) progress() (string, error) {
	mode := o.Progress
	if mode == "" {
		mode = os.Getenv("KILN_PROGRESS")
	}
	if mode == "" {
		return "auto", nil
	}
	for _, m := range buildkit.ProgressModes {
		if m == mode {
			return mode, nil
		}
	}
	return "", fmt.Errorf("progress mode %q is unknown (use one of %s via -progress or KILN_PROGRESS)", mode, strings.Join(buildkit.ProgressModes, ", "))
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
	// cacheSuffix is added to the Go cache mount id (a release's own).
	cacheSuffix string
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

// Session is a graph bound to a daemon, with the local sources it needs.
type Session struct {
	*image.Graph
	daemon *buildkit.Daemon
	locals map[string]string
	mode   string
	out    io.Writer
	// cacheTo and cacheFrom are the layer caches every solve uses.
	cacheTo, cacheFrom []client.CacheOptionsEntry
	// attach are the module download step's secrets and SSH agent.
	attach []bksession.Attachable
	// goCacheTo publishes a Go cache snapshot after the build; goCacheMax
	// caps snapshots (gocache.DefaultMax when 0).
	goCacheTo  string
	goCacheMax int64
	// goCacheKey is the pinned key seeded snapshots must be signed with;
	// signingKey signs published ones.
	goCacheKey ed25519.PublicKey
	signingKey ed25519.PrivateKey
	// registries are the hosts whose credentials the daemon may ask for.
	registries []string
	// sideEffects is true when the build imports, exports or seeds a cache:
	// it records no no-op.
	sideEffects bool
	// began is when the build began by the clock of the file system it
	// reads, for the no-op record of its inputs' stats; unset when none
	// may be recorded.
	began uptodate.Clock
	// clock is when the session began by that clock, for every session:
	// the vendor archive's racy window and the source digests' record go
	// by it.
	clock uptodate.Clock
	// hashes are the source digests inputs read; loading is the last
	// build's record of them, read while the plan resolves.
	hashes  *uptodate.SourceHashes
	loading *uptodate.PendingHashes
	// vendor is the vendor archive's local source, when the go steps read
	// one (golang.Graph.UseVendorArchive).
	vendor *vendorarchive.Source
	// outputs are the outputs as this build wrote or found them.
	outputs map[string]uptodate.FileStat
}

// UseRegistry lets the daemon ask for the credentials of a registry this
// build pushes to; the others it uses (caches) are added by Start.
func (s *Session) UseRegistry(ref string) {
	if host := buildkit.RegistryOf(ref); host != "" && !slices.Contains(s.registries, host) {
		s.registries = append(s.registries, host)
	}
}

// firstOf is the flag's value, else the configured one.
func firstOf(flag, configured string) string {
	if flag != "" {
		return flag
	}
	return configured
}

// Prepared is a build whose request is checked and whose plan is resolved
// for this machine, before any daemon is contacted; Start connects it.
type Prepared struct {
	opts     Options
	req      *request
	mode     string
	clock    uptodate.Clock
	loading  *uptodate.PendingHashes
	cache    string
	excludes []string
	// cacheTo and cacheFrom are the layer caches; goCacheTo and
	// goCacheFrom the Go cache snapshot repositories, with their keys.
	cacheTo, cacheFrom     []client.CacheOptionsEntry
	goCacheTo, goCacheFrom string
	goCacheKey             ed25519.PublicKey
	signingKey             ed25519.PrivateKey
	// plan is resolved for planned, with its local sources.
	plan    *plan.Plan
	planned ocispec.Platform
	sources *sources
}

// sources are a plan's local sources: the context, the toolchain archive,
// and the module download's proxies, secrets and SSH agent.
type sources struct {
	locals map[string]string
	fetch  *golang.Fetch
	attach []bksession.Attachable
}

// Prepare checks everything the user wrote (configuration, flags, cache
// specs, keys), reads the host facts (git, go env) once and resolves the
// plan for this machine's platform, which is the worker's when kiln runs
// the daemon: every configuration error comes before a daemon is contacted.
func Prepare(ctx context.Context, opts Options) (*Prepared, error) {
	return prepare(ctx, opts, sessionStart(opts), nil)
}

// Start prepares and starts a session.
func Start(ctx context.Context, opts Options) (*Session, error) {
	pr, err := Prepare(ctx, opts)
	if err != nil {
		return nil, err
	}
	return pr.Start(ctx)
}

// prepare is Prepare for a session that began at clock, by the file
// system's clock, with the git head a no-op check read (nil: none).
func prepare(ctx context.Context, opts Options, clock uptodate.Clock, head *plan.Git) (*Prepared, error) {
	mode, err := opts.progress()
	if err != nil {
		return nil, err
	}
	req, err := load(opts, head)
	if err != nil {
		return nil, err
	}
	pr := &Prepared{opts: opts, req: req, mode: mode, clock: clock}
	pr.loading = uptodate.LoadSourceHashesAsync(sourceHashesPath(opts.OutDirFor(req.root)), req.root, clock)
	if pr.cacheTo, err = buildkit.CacheEntries(opts.CacheTo, req.cfg.Cache.To, "-cacheto"); err != nil {
		return nil, err
	}
	if pr.cacheFrom, err = buildkit.CacheEntries(opts.CacheFrom, req.cfg.Cache.From, "-cachefrom"); err != nil {
		return nil, err
	}
	pr.goCacheTo, pr.goCacheFrom = firstOf(opts.GoCacheTo, req.cfg.Cache.GoCacheTo), firstOf(opts.GoCacheFrom, req.cfg.Cache.GoCacheFrom)
	if opts.Release && !opts.TrustCaches {
		// Whoever can write to a cache registry could choose what a
		// release contains: a release reads and writes no shared cache.
		pr.cacheTo, pr.cacheFrom, pr.goCacheTo, pr.goCacheFrom = nil, nil, "", ""
		req.cacheSuffix = ReleaseCacheSuffix
	}
	if err := buildkit.CheckCacheBackend(pr.cacheTo, opts.CacheTo, "-cacheto"); err != nil {
		return nil, err
	}
	if err := buildkit.CheckCacheBackend(pr.cacheFrom, opts.CacheFrom, "-cachefrom"); err != nil {
		return nil, err
	}
	if pr.goCacheKey, pr.signingKey, err = gocache.Keys(firstOf(opts.GoCacheKey, req.cfg.Cache.GoCacheKey), pr.goCacheTo != ""); err != nil {
		return nil, err
	}
	if pr.goCacheTo != "" {
		if _, _, err := gocache.Repo(pr.goCacheTo, "-gocacheto"); err != nil {
			return nil, err
		}
	}
	if pr.goCacheFrom != "" {
		if _, _, err := gocache.Repo(pr.goCacheFrom, "-gocachefrom"); err != nil {
			return nil, err
		}
	}
	if pr.excludes, err = dockerignore(req.root); err != nil {
		return nil, err
	}
	if pr.cache, err = buildkit.CacheDir(); err != nil {
		return nil, err
	}
	if err := pr.resolve(ctx, hostPlatform()); err != nil {
		return nil, err
	}
	return pr, nil
}

// Plan is the plan resolved for this machine's platform.
func (pr *Prepared) Plan() *plan.Plan { return pr.plan }

// resolve resolves the plan for the build platform bp, and its sources.
func (pr *Prepared) resolve(ctx context.Context, bp ocispec.Platform) error {
	req := pr.req
	po := req.po
	po.BuildPlatform = &bp
	// Fetched before the plan, which it lists with.
	var err error
	if po.ListGo, err = pinnedGo(ctx, req.cfg, bp, pr.cache, true, po.Host); err != nil {
		return err
	}
	p, err := plan.Resolve(req.root, req.cfg, po)
	if err != nil {
		return err
	}
	p.Cache.GoCache += req.cacheSuffix
	src, err := pr.sourcesOf(ctx, p)
	if err != nil {
		return err
	}
	pr.plan, pr.planned, pr.sources = p, bp, src
	return nil
}

// sourcesOf fetches the toolchain archive and reads what the module
// download needs from the host.
func (pr *Prepared) sourcesOf(ctx context.Context, p *plan.Plan) (*sources, error) {
	host := pr.req.po.Host
	tcDir, err := golang.ToolchainArchive(ctx, p.Toolchain, pr.cache, host.GoEnv["GOPROXY"])
	if err != nil {
		return nil, err
	}
	src := &sources{locals: map[string]string{golang.LocalContext: p.Root, golang.LocalToolchain: tcDir}}
	if len(p.Modules) == 0 {
		return src, nil
	}
	if host.GoEnvErr != nil {
		return nil, host.GoEnvErr
	}
	src.locals[golang.LocalCACerts] = "/etc/ssl/certs"
	if src.fetch, err = golang.ResolveFetch(ctx, pr.cache, host.GoEnv); err == nil {
		src.attach, err = src.fetch.Attachables()
	}
	if err != nil {
		return nil, err
	}
	maps.Copy(src.locals, src.fetch.Locals())
	return src, nil
}

// Start contacts BuildKit and learns the worker's platform: a worker of
// another platform than this machine's gets the plan resolved again for it.
// Then it wires the sources, the caches and the step tool.
func (pr *Prepared) Start(ctx context.Context) (*Session, error) {
	opts, req := pr.opts, pr.req
	kilnRoot, err := opts.RootDir()
	if err != nil {
		return nil, err
	}
	d, err := managed.Connect(ctx, kilnRoot)
	if err != nil {
		return nil, err
	}
	s, err := pr.start(ctx, d)
	if err != nil {
		d.Close()
		return nil, err
	}
	s.clock, s.loading = pr.clock, pr.loading
	s.mode, s.out = pr.mode, opts.ProgressOut
	s.cacheTo, s.cacheFrom = pr.cacheTo, buildkit.JobCacheImports(pr.cacheFrom)
	s.sideEffects = len(pr.cacheTo) > 0 || len(pr.cacheFrom) > 0 || pr.goCacheTo != "" || pr.goCacheFrom != ""
	s.Golang.TraceCompiles = opts.TraceCompiles
	s.goCacheTo, s.goCacheMax = pr.goCacheTo, opts.GoCacheMax
	s.goCacheKey, s.signingKey = pr.goCacheKey, pr.signingKey
	for _, e := range append(append([]client.CacheOptionsEntry{}, pr.cacheTo...), pr.cacheFrom...) {
		if ref := e.Attrs["ref"]; ref != "" {
			s.UseRegistry(ref)
		}
	}
	for _, repo := range []string{pr.goCacheTo, pr.goCacheFrom} {
		if repo != "" {
			s.UseRegistry(repo)
		}
	}
	for _, img := range s.Plan.Images {
		if img.Base != "" {
			s.UseRegistry(img.Base)
		}
	}
	if s.goCacheMax == 0 && req.cfg.Cache.GoCacheMax != "" {
		s.goCacheMax, _ = config.ParseSize(req.cfg.Cache.GoCacheMax) // validated by config.Load
	}
	if !opts.Release {
		if err := s.useKeptStepTool(ctx, pr.cache); err != nil {
			s.Close()
			return nil, err
		}
	}
	if pr.goCacheFrom != "" {
		s.seedGoCache(ctx, pr.goCacheFrom, pr.cache)
	}
	return s, nil
}

// start binds the plan for the daemon's worker to it.
func (pr *Prepared) start(ctx context.Context, d *buildkit.Daemon) (*Session, error) {
	bp, err := workerPlatform(ctx, d)
	if err != nil {
		return nil, err
	}
	if config.FormatPlatform(bp) != config.FormatPlatform(pr.planned) {
		log.G(ctx).Infof("BuildKit worker runs %s: compiling there", config.FormatPlatform(bp))
		if err := pr.resolve(ctx, bp); err != nil {
			return nil, err
		}
	}
	p, src := pr.plan, pr.sources
	s := &Session{Graph: image.NewGraph(p, pr.excludes, src.fetch), daemon: d, locals: src.locals, attach: src.attach}
	if p.ModMode == plan.ModVendor {
		files, err := s.Golang.UseVendorArchive()
		if err != nil {
			return nil, err
		}
		s.vendor = vendorarchive.New(p.Root, files, pr.cache, &s.clock)
	}
	return s, nil
}

// hostPlatform is the platform of a linux worker on this machine.
func hostPlatform() ocispec.Platform {
	return ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
}

// pinnedGo is the go command of the pinned toolchain for the worker's
// platform bp when it runs here, else "": the packages are then listed by
// the Go that compiles them, so that the plan (each binary's files, the
// standard library step) and every step are the same whatever Go runs
// kiln. Where it cannot run (a remote worker of another architecture, a
// mac), or is not there and fetch is unset, the go on PATH lists. With
// fetch, a toolchain not there yet is downloaded; where only the archive
// sent to BuildKit is kept, a failed download leaves the listing to the go
// on PATH.
func pinnedGo(ctx context.Context, cfg *config.Config, bp ocispec.Platform, cache string, fetch bool, host *plan.Host) (string, error) {
	if !runsHere(bp) {
		return "", nil
	}
	tc, err := plan.PinnedToolchain(cfg, bp)
	if err != nil {
		return "", nil // plan.Resolve reports it
	}
	dir := golang.ToolchainDir(tc, cache)
	if fetch {
		if dir, err = golang.FetchToolchain(ctx, tc, cache, host.GoEnv["GOPROXY"]); err != nil {
			if _, archived := os.Stat(filepath.Join(golang.ToolchainArchiveDir(tc, cache), golang.ToolchainTar)); archived != nil {
				return "", err
			}
			log.G(ctx).Warnf("listing the packages with the go on PATH: %v", err)
			return "", nil
		}
	}
	goCmd := filepath.Join(dir, "bin", "go")
	if _, err := os.Stat(goCmd); err != nil {
		return "", nil
	}
	return goCmd, nil
}

func runsHere(bp ocispec.Platform) bool {
	return runtime.GOOS == "linux" && config.FormatPlatform(bp) == config.FormatPlatform(hostPlatform())
}

func (s *Session) Close() {
	if s.vendor != nil {
		s.vendor.Close()
	}
	s.daemon.Close()
}

// sawOutputs notes outputs as this build wrote or found them.
func (s *Session) sawOutputs(r uptodate.OutputRecord) {
	if s.outputs == nil {
		s.outputs = map[string]uptodate.FileStat{}
	}
	maps.Copy(s.outputs, r.Files)
}

func (s *Session) solveOptions(ctx context.Context) buildkit.SolveOptions {
	mounts := s.Golang.SourceMounts()
	if s.vendor != nil {
		mounts[golang.LocalVendor] = s.vendor
	}
	return buildkit.SolveOptions{Locals: s.locals, Mounts: mounts, Progress: s.mode, Out: s.out,
		CacheExports: s.cacheTo, CacheImports: s.cacheFrom, Session: append(buildkit.AuthSession(ctx, s.registries), s.attach...), Hint: plan.Hint}
}

func workerPlatform(ctx context.Context, d *buildkit.Daemon) (ocispec.Platform, error) {
	workers, err := d.ListWorkers(ctx)
	if err != nil {
		return ocispec.Platform{}, fmt.Errorf("list BuildKit workers at %s: %w", d.Address, err)
	}
	if len(workers) == 0 || len(workers[0].Platforms) == 0 {
		return ocispec.Platform{}, fmt.Errorf("BuildKit at %s has no worker; check its configuration", d.Address)
	}
	return workers[0].Platforms[0], nil
}

func dockerignore(root string) ([]string, error) {
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	return patterns, nil
}

// ImageResult is one exported image.
type ImageResult struct {
	Name      string   `json:"name"`
	Ref       string   `json:"ref"`
	Digest    string   `json:"digest"`
	Path      string   `json:"path"`
	Platforms []string `json:"platforms"`
	// Kept is true when the tarball written before was made from the same
	// inputs, so the image was neither built nor exported.
	Kept bool `json:"kept,omitempty"`
}

// ImagesOutcome is what Images built and which steps ran.
type ImagesOutcome struct {
	Images []ImageResult
	buildkit.Steps
	// Checks are the quick checks run on the new images.
	Checks *inspect.Report
	// Explanations say which steps ran and why.
	Explanations []explain.Explanation
	// GoCache is the Go cache snapshot published, when asked for.
	GoCache *gocache.Result
}

// Images builds every planned image and writes each as an OCI layout
// tarball under <out>/images/<name>.oci.tar.
func Images(ctx context.Context, opts Options) (*ImagesOutcome, error) {
	head := headOf(opts)
	if r, dir, ok := noopOutcome(opts, "images", head); ok {
		return r.images(opts, dir)
	}
	began := startNoop(opts, "images")
	clock := began
	if !clock.OK {
		clock = sessionStart(opts)
	}
	pr, err := prepare(ctx, opts, clock, head)
	if err != nil {
		return nil, err
	}
	s, err := pr.Start(ctx)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	s.began = began
	noopInputs := s.statNoopInputs(opts, "images", head)
	defer noopInputs.wait()
	out, err := s.WriteImages(ctx, opts)
	if err != nil {
		return nil, err
	}
	if out.Checks == nil || out.Checks.Failed() == 0 {
		r := noopResult{Images: out.Images}
		var outputs []string
		for _, img := range out.Images {
			outputs = append(outputs, img.Path)
		}
		if !opts.SkipChecks {
			outputs = append(outputs, inspect.CheckedMarker(ImagesDir(opts, s.Plan)))
		}
		for _, st := range out.Steps {
			r.Steps = append(r.Steps, st.Name)
		}
		for _, e := range out.Explanations {
			r.Tracked = append(r.Tracked, e.Step)
		}
		s.recordNoop(noopInputs, outputs, r)
	}
	return out, nil
}

// ImagesDir is where Images writes the images of p.
func ImagesDir(opts Options, p *plan.Plan) string {
	return filepath.Join(opts.OutDirFor(p.Root), "images")
}

// WriteImages builds every planned image in this session and writes each
// as an OCI layout tarball, as Images does, but records no no-op.
func (s *Session) WriteImages(ctx context.Context, opts Options) (*ImagesOutcome, error) {
	outDir := opts.OutDirFor(s.Plan.Root)
	dir := ImagesDir(opts, s.Plan)
	inputs, err := s.inputs(outDir)
	if err != nil {
		return nil, err
	}
	done := readOutputs(outDir)
	out := &ImagesOutcome{Images: make([]ImageResult, len(s.Plan.Images))}
	keys := make([]string, len(s.Plan.Images))
	var jobs []buildkit.Job
	var solved []int
	for i, img := range s.Plan.Images {
		dest := inspect.ImagePath(dir, img.Name)
		out.Images[i] = ImageResult{Name: img.Name, Ref: img.Ref, Path: dest, Platforms: img.PlatformIDs()}
		attrs := s.ExporterAttrs(img.Ref, img.Base != "")
		keys[i], _ = uptodate.OutputKey("image", img.Name, inputs, assembleSteps(img), "oci "+fmt.Sprint(attrs), "platforms "+strings.Join(img.PlatformIDs(), ","))
		if r, ok := done.Current("image "+img.Name, keys[i]); ok && s.mayReuse(opts) && r.Files[dest] != (uptodate.FileStat{}) {
			out.Images[i].Digest, out.Images[i].Kept = r.Digest, true
			s.sawOutputs(r)
			continue
		}
		solved = append(solved, i)
		jobs = append(jobs, buildkit.Job{
			Name:          img.Name,
			Build:         s.Build(img),
			FrontendAttrs: map[string]string{"platform": strings.Join(img.PlatformIDs(), ",")},
			Export:        client.ExportEntry{Type: client.ExporterOCI, Attrs: attrs},
			Dest:          dest,
		})
	}
	if len(jobs) > 0 {
		outcome, err := s.SolveImages(ctx, jobs)
		if err != nil {
			return nil, err
		}
		out.Steps = outcome.Steps
		for j, r := range outcome.Results {
			i := solved[j]
			out.Images[i].Digest, out.Images[i].Path = r.Digest, r.Dest
			s.sawOutputs(done.Set("image "+s.Plan.Images[i].Name, s.recordable(keys[i]), r.Digest, []string{r.Dest}))
		}
		if err := done.Write(); err != nil {
			return nil, err
		}
	}
	s.saveSourceHashes()
	// The steps of images kept as they were are reused, for explain.
	for _, name := range slices.Sorted(maps.Keys(inputs)) {
		if !slices.ContainsFunc(out.Steps, func(st buildkit.Step) bool { return st.Name == name }) {
			out.Steps = append(out.Steps, buildkit.Step{Name: name, Cached: true})
		}
	}
	if !opts.SkipChecks {
		var digests [][2]string
		for _, img := range out.Images {
			digests = append(digests, [2]string{img.Name, img.Digest})
		}
		if out.Checks, err = inspect.QuickChecksOnce(s.Plan, dir, digests); err != nil {
			return nil, err
		}
		marker := inspect.CheckedMarker(dir)
		if st, ok := uptodate.StatFile(marker); ok {
			s.sawOutputs(uptodate.OutputRecord{Files: map[string]uptodate.FileStat{marker: st}})
		}
	}
	if out.Explanations, err = record(opts, s.Plan, inputs, out.Steps); err != nil {
		return nil, err
	}
	if s.goCacheTo != "" {
		if out.GoCache, err = s.publishGoCache(ctx, s.goCacheTo, s.goCacheMax); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// recordable is the key to record outputs under: one no build matches when
// a vendored file changed so lately that the build may not have built what
// the key names. The record stays, for how the files were written.
func (s *Session) recordable(key string) string {
	if s.vendor.ChangedLately() {
		return "unconfirmed " + key
	}
	return key
}

// mayReuse says whether outputs written by an earlier build with the same
// inputs may stand in for this build's: not when the caller asked for a
// rebuild, when every step must re-run, or when the solve has side effects
// beside the outputs (layer cache and Go cache exports, traced compiles).
// Every build records its outputs' key all the same: the bytes are the same.
func (s *Session) mayReuse(opts Options) bool {
	return !opts.Rebuild && !s.NoCache && !s.Golang.TraceCompiles && len(s.cacheTo) == 0 && s.goCacheTo == ""
}

// inputs are what each tracked step of this build depends on.
func (s *Session) inputs(outDir string) (explain.Inputs, error) {
	defs, err := s.Graph.Definitions()
	if err != nil {
		return nil, err
	}
	s.hashes = s.loading.Take(sourceHashesPath(outDir), s.Plan.Root, s.clock)
	var files []string
	for _, b := range s.Plan.Binaries {
		files = append(files, b.Files...)
	}
	slices.Sort(files)
	s.hashes.Prestat(slices.Compact(files))
	return explain.Collect(s.Plan, defs, s.hashes.Hash)
}

// saveSourceHashes keeps the digests inputs read, once the build has
// written its outputs: a failed build leaves nothing in the output folder.
func (s *Session) saveSourceHashes() {
	if s.hashes != nil {
		s.hashes.Save()
	}
}

// assembleSteps are the steps that put an image together, one per platform;
// their inputs hold those of every binary in the image.
func assembleSteps(img plan.Image) []string {
	var steps []string
	for _, target := range img.Targets {
		steps = append(steps, image.AssembleStepName(img.Name, target))
	}
	return steps
}

// BinariesOutcome is where Binaries wrote and which steps ran.
type BinariesOutcome struct {
	Dir string
	// Kept is true when the binaries written before were made from the same
	// inputs, so nothing was built.
	Kept bool
	buildkit.Steps
	// Sent are the files the daemon sent, the binaries whose bytes changed;
	// the others were kept from the last build.
	Sent []string
	// GoCache is the Go cache snapshot published, when asked for.
	GoCache *gocache.Result
}

// Binaries builds every configured binary for every platform and writes
// them to <out>/bin/<os>_<arch>/<name>.
func Binaries(ctx context.Context, opts Options) (*BinariesOutcome, error) {
	head := headOf(opts)
	if r, _, ok := noopOutcome(opts, "binaries", head); ok {
		return &BinariesOutcome{Dir: r.Dir, Kept: true, Steps: r.steps()}, nil
	}
	began := startNoop(opts, "binaries")
	clock := began
	if !clock.OK {
		clock = sessionStart(opts)
	}
	pr, err := prepare(ctx, opts, clock, head)
	if err != nil {
		return nil, err
	}
	s, err := pr.Start(ctx)
	if err != nil {
		return nil, err
	}
	s.began = began
	noopInputs := s.statNoopInputs(opts, "binaries", head)
	defer noopInputs.wait()
	defer s.Close()
	var files []buildkit.FileCopy
	var links, built, written []string
	dest := filepath.Join(opts.OutDirFor(s.Plan.Root), "bin")
	for _, target := range s.Plan.Platforms {
		for _, b := range s.Plan.Binaries {
			// Straight from the go build's output of this binary: a step
			// per binary that copies it out first would only add a round
			// trip per file.
			step, path := s.Linked(b.Name, target)
			to := golang.BinaryPath(b, target)
			files = append(files, buildkit.FileCopy{From: step, Src: path, Dest: to})
			links = append(links, golang.LinkStepName(b.Name, target))
			written = append(written, filepath.Join(dest, to))
		}
		built = append(built, golang.PackageStepName(target))
	}
	inputs, err := s.inputs(opts.OutDirFor(s.Plan.Root))
	if err != nil {
		return nil, err
	}
	done := readOutputs(opts.OutDirFor(s.Plan.Root))
	key, _ := uptodate.OutputKey("binaries", dest, inputs, links, written...)
	out := &BinariesOutcome{Dir: dest}
	recorded := noopResult{Dir: dest, Steps: built}
	if r, ok := done.Current("binaries", key); ok && s.mayReuse(opts) {
		s.sawOutputs(r)
		out.Kept, out.Steps = true, recorded.steps()
		s.saveSourceHashes()
		s.recordNoop(noopInputs, written, recorded)
		return out, nil
	}
	if out.Steps, out.Sent, err = s.ExportFiles(ctx, "binaries", files, dest, done.Written("binaries")); err != nil {
		return nil, err
	}
	s.sawOutputs(done.Set("binaries", s.recordable(key), "", written))
	if err := done.Write(); err != nil {
		return nil, err
	}
	s.saveSourceHashes()
	if s.goCacheTo != "" {
		if out.GoCache, err = s.publishGoCache(ctx, s.goCacheTo, s.goCacheMax); err != nil {
			return nil, err
		}
	}
	s.recordNoop(noopInputs, written, recorded)
	return out, nil
}

// ExportFiles solves the files and writes them into one directory at dest
// (buildkit.Daemon.ExportFiles); written is how kiln last wrote dest's
// files, from the up-to-date record (nil for none).
func (s *Session) ExportFiles(ctx context.Context, name string, files []buildkit.FileCopy, dest string, written map[string]uptodate.FileStat) (steps buildkit.Steps, sent []string, err error) {
	asWritten := func(path string) (int64, int64, bool) {
		was, ok := written[path]
		now, exists := uptodate.StatFile(path)
		// Times in whole seconds (a layer from a registry cache keeps no
		// more) or no change time cannot tell one link's binary from another's.
		if !ok || !exists || now != was || was.ChangeTime == 0 || was.ModTime%1e9 == 0 {
			return 0, 0, false
		}
		return was.Size, was.ModTime, true
	}
	opts := s.solveOptions(ctx)
	return s.daemon.ExportFiles(ctx, name, files, dest, asWritten, opts)
}
