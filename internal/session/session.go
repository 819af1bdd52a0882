// Package session owns one build's orchestration: it loads and checks the
// request, connects to BuildKit once, resolves the plan for the worker,
// assembles the graph (package image), solves it and writes the outputs
// (OCI layouts, binaries), keeping the records that let the next build
// skip work (no-op, up-to-date outputs, source digests: package uptodate)
// and the explain record; then it closes. Publishing (package publish), the
// release (package release) and the verify targets (package verify) build
// on its Session.
package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"

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
	"github.com/kiln-build/kiln/internal/sign"
	"github.com/kiln-build/kiln/internal/uptodate"
)

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
	goCacheKey *sign.Verifier
	signingKey *sign.Signer
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
	// noop are the stats of the inputs a no-op record would keep (nil: no
	// record); readChanged is set when an input changed while the daemon
	// read the sources: nothing is recorded as made from them.
	noop        *noopInputs
	readChanged bool
	// keyInputs are the inputs the outputs' keys were made of, from defs.
	keyInputs explain.Inputs
	defs      map[string]map[string]string
	// outputs are the outputs as this build wrote or found them.
	outputs map[string]uptodate.Stat
	// cleanups run at Close (an isolated Go cache is emptied).
	cleanups []func()
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
	goCacheKey             *sign.Verifier
	signingKey             *sign.Signer
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
	mode, err := opts.ProgressMode()
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
	if pr.goCacheFrom != "" && pr.goCacheKey == nil {
		// Unsigned, a snapshot is whatever its registry's writers pushed.
		if !opts.GoCacheUnsigned && !req.cfg.Cache.GoCacheUnsigned {
			return nil, fmt.Errorf("%s: cache.gocacheFrom %s: a Go cache snapshot is seeded only when signed with the key cache.gocacheKey pins; pin one, or set cache.gocacheUnsigned: true to seed unsigned ones", config.File, pr.goCacheFrom)
		}
		if pr.signingKey != nil {
			return nil, fmt.Errorf("%s: cache.gocacheFrom %s is seeded unsigned, and what a build seeded from it compiles is never published signed: pin cache.gocacheKey, or publish without %s", config.File, pr.goCacheFrom, gocache.SigningKeyEnv)
		}
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
	// A daemon kiln runs has this machine's platform: the plan is resolved
	// for it now. BUILDKIT_HOST's worker may have another, with pins and
	// a toolchain of its own: its plan waits for its platform.
	if opts.Daemon == "" && os.Getenv(buildkit.HostEnv) == "" {
		if err := pr.resolve(ctx, hostPlatform()); err != nil {
			return nil, err
		}
	}
	return pr, nil
}

// Plan is the plan resolved for this machine's platform: the one Start
// builds when the worker has it.
func (pr *Prepared) Plan() (*plan.Plan, error) {
	if pr.plan != nil {
		return pr.plan, nil
	}
	return plan.Resolve(pr.req.root, pr.req.cfg, pr.req.po)
}

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
	if err != nil && host.GoEnvErr != nil {
		return nil, host.GoEnvErr // the cause: no GOPROXY to fetch from
	} else if err != nil {
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
	addr := opts.Daemon
	if addr == "" {
		addr = os.Getenv(buildkit.HostEnv)
	}
	d, err := managed.ConnectTo(ctx, kilnRoot, addr)
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
		for _, base := range img.AllBases() {
			s.UseRegistry(base)
		}
	}
	if s.goCacheMax == 0 && req.cfg.Cache.GoCacheMax != "" {
		s.goCacheMax, _ = config.ParseSize(req.cfg.Cache.GoCacheMax) // validated by config.Load
	}
	switch {
	case opts.Release && !opts.TrustCaches:
		// The daemon's local cache holds what any earlier build imported
		// from a layer cache, under the keys a release's steps have.
		if err := s.isolate(ctx); err != nil {
			s.Close()
			return nil, err
		}
	case !opts.Release:
		if err := s.useKeptStepTool(ctx, pr.cache); err != nil {
			s.Close()
			return nil, err
		}
	}
	if pr.goCacheFrom != "" {
		s.seedGoCache(ctx, pr.goCacheFrom, pr.cache, opts.SnapshotTargets)
	}
	return s, nil
}

// start binds the plan for the daemon's worker to it.
func (pr *Prepared) start(ctx context.Context, d *buildkit.Daemon) (*Session, error) {
	bp, err := workerPlatform(ctx, d)
	if err != nil {
		return nil, err
	}
	if pr.plan == nil || config.FormatPlatform(bp) != config.FormatPlatform(pr.planned) {
		if config.FormatPlatform(bp) != config.FormatPlatform(hostPlatform()) {
			log.G(ctx).Infof("BuildKit worker runs %s: compiling there", config.FormatPlatform(bp))
		}
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
		if dir, err = golang.FetchToolchain(ctx, tc, cache, host.GoEnv["GOPROXY"]); err != nil && host.GoEnvErr != nil {
			err = host.GoEnvErr // the cause: no GOPROXY to fetch from
		}
		if err != nil {
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

// testHookBeforeSolve runs after the inputs were read and before the
// daemon reads the sources (a test edits a file there).
var testHookBeforeSolve func()

// beforeSolve waits for the no-op record's stats of the inputs: taken
// before the daemon reads them, a change after shows next time.
func (s *Session) beforeSolve() {
	if s.noop != nil {
		s.noop.wait()
	}
	if testHookBeforeSolve != nil {
		testHookBeforeSolve()
	}
}

// afterSolve notes whether an input changed since it was read for the
// build's keys (a branch switched mid-build): the daemon may have read
// other bytes than those the keys name.
func (s *Session) afterSolve() {
	changed := s.hashes != nil && s.hashes.Changed()
	if !changed && s.keyInputs != nil {
		// The sources stat as they did (their digests stand); the rest of
		// the inputs (image files, image.yaml) is read again: it is small.
		again, err := explain.Collect(s.Plan, s.defs, s.hashes.Hash)
		changed = err != nil || !maps.EqualFunc(again, s.keyInputs, maps.Equal)
	}
	if !changed && s.noop != nil {
		changed = s.noop.changed()
	}
	if changed {
		s.readChanged = true
	}
}

func (s *Session) Close() {
	for _, f := range s.cleanups {
		f()
	}
	if s.vendor != nil {
		s.vendor.Close()
	}
	s.daemon.Close()
}

// sawOutputs notes outputs as this build wrote or found them.
func (s *Session) sawOutputs(r uptodate.OutputRecord) {
	if s.outputs == nil {
		s.outputs = map[string]uptodate.Stat{}
	}
	maps.Copy(s.outputs, r.Files)
}

func (s *Session) solveOptions(ctx context.Context) buildkit.SolveOptions {
	mounts := s.Golang.SourceMounts()
	if s.vendor != nil {
		mounts[golang.LocalVendor] = s.vendor
	}
	return buildkit.SolveOptions{Locals: s.locals, Mounts: mounts, Progress: s.mode, Out: s.out,
		CacheExports: s.cacheTo, CacheImports: s.cacheFrom, Session: append(buildkit.AuthSession(ctx, s.registries), s.attach...), Hint: plan.Hint,
		Marshal: s.Graph.Marshal, Solved: s.Graph.Solved}
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
