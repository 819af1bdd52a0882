// Package build wires the stages of the flow for the mage targets: config,
// plan, toolchain, LLB graph, solve and export. It holds no stage logic itself.
package build

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/exporter/containerimage/exptypes"
	gateway "github.com/moby/buildkit/frontend/gateway/client"
	gatewaypb "github.com/moby/buildkit/frontend/gateway/pb"
	bksession "github.com/moby/buildkit/session"
	"github.com/moby/buildkit/solver/result"
	"github.com/moby/patternmatcher/ignorefile"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/kiln-build/kiln/pkg/buildkit"
	"github.com/kiln-build/kiln/pkg/config"
	"github.com/kiln-build/kiln/pkg/explain"
	"github.com/kiln-build/kiln/pkg/golang"
	"github.com/kiln-build/kiln/pkg/image"
	"github.com/kiln-build/kiln/pkg/plan"
	"github.com/kiln-build/kiln/pkg/release"
	"github.com/kiln-build/kiln/pkg/verify"
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
}

func (o *Options) root() (string, error) {
	if o.Root != "" {
		return filepath.Abs(o.Root)
	}
	return os.Getwd()
}

func (o *Options) outDir(root string) string {
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
	return resolve(opts, nil)
}

func resolve(opts Options, buildPlatform *ocispec.Platform) (*plan.Plan, error) {
	root, err := opts.root()
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
	po := plan.Options{Stamp: opts.Stamp, Images: opts.Images, BuildPlatform: buildPlatform}
	list, source := opts.Platforms, "-platforms"
	if list == "" {
		list, source = os.Getenv("PLATFORMS"), "PLATFORMS"
	}
	if list != "" {
		if po.Platforms, err = config.ParsePlatforms(list); err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
	}
	return plan.Resolve(root, cfg, po)
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
	ext.Stamp.Package = ""
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

// graph is the LLB graph of a plan: compile steps shared by every image
// that carries the binary, and one root filesystem per image and platform.
type graph struct {
	plan   *plan.Plan
	golang *golang.Graph
	// noCache marshals every vertex with IgnoreCache (reproducibility checks).
	noCache bool
	// sbom attaches an SPDX SBOM of each platform's binaries (releases).
	sbom bool

	mu       sync.Mutex
	binaries map[string]llb.State // by "name platform symbols"
	prepared map[string]llb.State // by platform
}

func newGraph(p *plan.Plan, excludes []string, fetch *golang.Fetch) *graph {
	return newGraphFrom(p, golang.Context(p.Root, excludes), golang.Toolchain(p.Toolchain), fetch)
}

// newGraphFrom builds a graph on given context and toolchain sources.
func newGraphFrom(p *plan.Plan, context, toolchain llb.State, fetch *golang.Fetch) *graph {
	return &graph{
		plan:     p,
		golang:   golang.NewGraph(p, context, toolchain, fetch),
		binaries: map[string]llb.State{},
		prepared: map[string]llb.State{},
	}
}

// session is a graph bound to a daemon, with the local sources it needs.
type session struct {
	*graph
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
}

// firstOf is the flag's value, else the configured one.
func firstOf(flag, configured string) string {
	if flag != "" {
		return flag
	}
	return configured
}

func start(ctx context.Context, opts Options) (*session, error) {
	mode, err := opts.progress()
	if err != nil {
		return nil, err
	}
	p, err := Plan(opts) // every configuration error before the daemon is contacted
	if err != nil {
		return nil, err
	}
	excludes, err := dockerignore(p.Root)
	if err != nil {
		return nil, err
	}
	kilnRoot, err := opts.root()
	if err != nil {
		return nil, err
	}
	d, err := buildkit.Connect(ctx, kilnRoot)
	if err != nil {
		return nil, err
	}
	if bp, err := workerPlatform(ctx, d); err != nil {
		d.Close()
		return nil, err
	} else if config.FormatPlatform(bp) != config.FormatPlatform(p.BuildPlatform) {
		logrus.Infof("BuildKit worker runs %s: compiling there", config.FormatPlatform(bp))
		if p, err = resolve(opts, &bp); err != nil {
			d.Close()
			return nil, err
		}
	}
	cache, err := buildkit.CacheDir()
	if err != nil {
		d.Close()
		return nil, err
	}
	tcDir, err := golang.FetchToolchain(ctx, p.Toolchain, cache)
	if err != nil {
		d.Close()
		return nil, err
	}
	locals := map[string]string{golang.LocalContext: p.Root, golang.LocalToolchain: tcDir}
	var fetch *golang.Fetch
	var attach []bksession.Attachable
	if len(p.Modules) > 0 {
		locals[golang.LocalCACerts] = "/etc/ssl/certs"
		if fetch, err = golang.ResolveFetch(cache); err == nil {
			attach, err = fetch.Attachables()
		}
		if err != nil {
			d.Close()
			return nil, err
		}
		maps.Copy(locals, fetch.Locals())
	}
	s := &session{graph: newGraph(p, excludes, fetch), daemon: d, locals: locals, mode: mode, out: opts.ProgressOut, attach: attach}
	if s.cacheTo, err = cacheEntries(opts.CacheTo, p.Cache.To, "-cacheto"); err != nil {
		d.Close()
		return nil, err
	}
	if s.cacheFrom, err = cacheEntries(opts.CacheFrom, p.Cache.From, "-cachefrom"); err != nil {
		d.Close()
		return nil, err
	}
	s.cacheFrom = s.perImageImports(s.cacheFrom)
	s.golang.TraceCompiles = opts.TraceCompiles
	s.goCacheTo, s.goCacheMax = firstOf(opts.GoCacheTo, p.Cache.GoCacheTo), opts.GoCacheMax
	if s.goCacheMax == 0 && p.Cache.GoCacheMax != "" {
		s.goCacheMax, _ = config.ParseSize(p.Cache.GoCacheMax) // validated by config.Load
	}
	if s.goCacheTo != "" {
		if _, _, err := goCacheRepo(s.goCacheTo, "-gocacheto"); err != nil {
			d.Close()
			return nil, err
		}
	}
	if from := firstOf(opts.GoCacheFrom, p.Cache.GoCacheFrom); from != "" {
		s.seedGoCache(ctx, from, cache)
	}
	return s, nil
}

func (s *session) close() { s.daemon.Close() }

func (s *session) solveOptions() buildkit.SolveOptions {
	return buildkit.SolveOptions{Locals: s.locals, Progress: s.mode, Out: s.out,
		CacheExports: s.cacheTo, CacheImports: s.cacheFrom, Session: append(authSession(), s.attach...), Hint: plan.Hint}
}

// cacheImports are the layer caches the client asked for: a gateway build
// must pass them on to each solve itself, as the Dockerfile frontend does.
func cacheImports(c gateway.Client) []gateway.CacheOptionsEntry {
	var entries []gateway.CacheOptionsEntry
	if dt := c.BuildOpts().Opts["cache-imports"]; dt != "" {
		json.Unmarshal([]byte(dt), &entries) // written by the client library from our own options
	}
	return entries
}

// perImageImports imports the images' and the binaries' registry caches (exports are
// tagged per image), and the binaries export as well.
func (s *session) perImageImports(imports []client.CacheOptionsEntry) []client.CacheOptionsEntry {
	var out []client.CacheOptionsEntry
	for _, e := range imports {
		ref := e.Attrs["ref"]
		if e.Type != "registry" || ref == "" {
			out = append(out, e)
			continue
		}
		names := []string{"binaries", "images", "gocache"}
		for _, n := range names {
			attrs := map[string]string{}
			for k, v := range e.Attrs {
				attrs[k] = v
			}
			attrs["ref"] = buildkit.JobCacheRef(ref, n)
			out = append(out, client.CacheOptionsEntry{Type: e.Type, Attrs: attrs})
		}
	}
	return out
}

// cacheEntries parses a layer cache from the flag, else the configuration.
// A registry on loopback is reached over plain HTTP, as for pushes.
func cacheEntries(flag, configured, name string) ([]client.CacheOptionsEntry, error) {
	value, source := flag, name
	if value == "" {
		value, source = configured, config.File+" cache"
	}
	if value == "" {
		return nil, nil
	}
	spec, err := config.ParseCache(value)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	if ref := spec.Attrs["ref"]; ref != "" {
		if _, plainHTTP, err := registryHost(strings.SplitN(ref, "/", 2)[0], false); err == nil && plainHTTP {
			spec.Attrs["registry.insecure"] = "true"
		}
	}
	return []client.CacheOptionsEntry{{Type: spec.Type, Attrs: spec.Attrs}}, nil
}

// binary returns the compile step of one binary for one platform, once.
func (s *graph) binary(name string, target ocispec.Platform) llb.State {
	return s.link(name, target, false)
}

// binaryWithSymbols is binary keeping the symbol table, for size reports.
func (s *graph) binaryWithSymbols(name string, target ocispec.Platform) llb.State {
	return s.link(name, target, true)
}

func (s *graph) link(name string, target ocispec.Platform, symbols bool) llb.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	platform := config.FormatPlatform(target)
	key := fmt.Sprintf("%s %s %t", name, platform, symbols)
	if st, ok := s.binaries[key]; ok {
		return st
	}
	prepared, ok := s.prepared[platform]
	if !ok {
		prepared = s.golang.Prepare(s.plan.Binaries, target)
		s.prepared[platform] = prepared
	}
	b := s.plan.Binary(name)
	var st llb.State
	if symbols {
		st = s.golang.CompileWithSymbols(*b, s.golang.Sources(*b), prepared, target)
	} else {
		st = s.golang.Compile(*b, s.golang.Sources(*b), prepared, target)
	}
	s.binaries[key] = st
	return st
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

// imageStates returns each platform's root filesystem of one image, in plan order.
func (s *graph) imageStates(img plan.Image) []llb.State {
	states := make([]llb.State, len(s.plan.Platforms))
	for i, target := range s.plan.Platforms {
		bins := map[string]llb.State{}
		for _, b := range img.Binaries {
			bins[b] = s.binary(b, target)
		}
		states[i] = image.Rootfs(img, target, bins, s.golang.Context, s.plan.Created())
	}
	return states
}

// imageBuild is the gateway build of one multi-platform image: one ref per
// platform plus the platforms metadata, as the Dockerfile frontend returns.
func (s *graph) imageBuild(img plan.Image) gateway.BuildFunc {
	states := s.imageStates(img)
	return func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
		res := gateway.NewResult()
		var mu sync.Mutex
		eg, ctx := errgroup.WithContext(ctx)
		for i, target := range s.plan.Platforms {
			id := config.FormatPlatform(target)
			eg.Go(func() error {
				var marshal []llb.ConstraintsOpt
				if s.noCache {
					marshal = append(marshal, llb.IgnoreCache)
				}
				def, err := states[i].Marshal(ctx, marshal...)
				if err != nil {
					return err
				}
				r, err := c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB(), CacheImports: cacheImports(c)})
				if err != nil {
					return err
				}
				ref, err := r.SingleRef()
				if err != nil {
					return err
				}
				cfg, err := json.Marshal(image.Config(s.plan, img, target))
				if err != nil {
					return err
				}
				var att *result.Attestation[gateway.Reference]
				if s.sbom {
					if att, err = s.sbomAttestation(ctx, c, img, target, ref); err != nil {
						return err
					}
				}
				mu.Lock()
				defer mu.Unlock()
				res.AddRef(id, ref)
				res.AddMeta(exptypes.ExporterImageConfigKey+"/"+id, cfg)
				if att != nil {
					res.AddAttestation(id, *att)
				}
				return nil
			})
		}
		if err := eg.Wait(); err != nil {
			return nil, err
		}
		exp := exptypes.Platforms{}
		for _, target := range s.plan.Platforms {
			exp.Platforms = append(exp.Platforms, exptypes.Platform{ID: config.FormatPlatform(target), Platform: target})
		}
		dt, err := json.Marshal(exp)
		if err != nil {
			return nil, err
		}
		res.AddMeta(exptypes.ExporterPlatformsKey, dt)
		return res, nil
	}
}

// sbomAttestation reads the binaries back from the built image and
// attaches their SBOM as an in-toto attestation of that platform.
func (s *graph) sbomAttestation(ctx context.Context, c gateway.Client, img plan.Image, target ocispec.Platform, ref gateway.Reference) (*result.Attestation[gateway.Reference], error) {
	bins := map[string][]byte{}
	for _, b := range img.Binaries {
		data, err := ref.ReadFile(ctx, gateway.ReadRequest{Filename: image.BinDir + "/" + b})
		if err != nil {
			return nil, fmt.Errorf("read %s back for the SBOM: %w", b, err)
		}
		bins[b] = data
	}
	doc, err := release.SBOM(img.Name, config.FormatPlatform(target), s.plan.Stamp.Version, s.plan.Created(), bins)
	if err != nil {
		return nil, err
	}
	const path = "/sbom.spdx.json"
	st := llb.Scratch().File(llb.Mkfile(path, 0o644, doc, llb.WithCreatedTime(s.plan.Created())),
		llb.WithCustomNamef("[%s %s] SBOM", img.Name, config.FormatPlatform(target)))
	def, err := st.Marshal(ctx)
	if err != nil {
		return nil, err
	}
	r, err := c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB()})
	if err != nil {
		return nil, err
	}
	sref, err := r.SingleRef()
	if err != nil {
		return nil, err
	}
	return &result.Attestation[gateway.Reference]{
		Kind:   gatewaypb.AttestationKind_InToto,
		Ref:    sref,
		Path:   path,
		InToto: result.InTotoAttestation{PredicateType: release.SPDXPredicateType},
	}, nil
}

// exporterAttrs make the export reproducible: layer timestamps rewritten to
// the source date, OCI media types.
func (s *graph) exporterAttrs(name string) map[string]string {
	return map[string]string{
		"name":                                  name,
		string(exptypes.OptKeyOCITypes):         "true",
		string(exptypes.OptKeyRewriteTimestamp): "true",
		"source-date-epoch":                     strconv.FormatInt(s.plan.SourceDateEpoch, 10),
	}
}

// ImageResult is one exported image.
type ImageResult struct {
	Name      string   `json:"name"`
	Ref       string   `json:"ref"`
	Digest    string   `json:"digest"`
	Path      string   `json:"path"`
	Platforms []string `json:"platforms"`
}

// ImagesOutcome is what Images built and which steps ran.
type ImagesOutcome struct {
	Images []ImageResult
	buildkit.Steps
	// Checks are the quick checks run on the new images.
	Checks *verify.Report
	// Explanations say which steps ran and why.
	Explanations []explain.Explanation
	// GoCache is the Go cache snapshot published, when asked for.
	GoCache *GoCacheResult
}

// Images builds every planned image and writes each as an OCI layout
// tarball under <out>/images/<name>.oci.tar.
func Images(ctx context.Context, opts Options) (*ImagesOutcome, error) {
	s, err := start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.close()
	return s.images(ctx, opts)
}

func (s *session) images(ctx context.Context, opts Options) (*ImagesOutcome, error) {
	dir := filepath.Join(opts.outDir(s.plan.Root), "images")
	var jobs []buildkit.Job
	for _, img := range s.plan.Images {
		jobs = append(jobs, buildkit.Job{
			Name:          img.Name,
			Build:         s.imageBuild(img),
			FrontendAttrs: map[string]string{"platform": strings.Join(s.plan.PlatformIDs(), ",")},
			Export:        client.ExportEntry{Type: client.ExporterOCI, Attrs: s.exporterAttrs(img.Ref)},
			Dest:          filepath.Join(dir, img.Name+".oci.tar"),
		})
	}
	outcome, err := s.solveImages(ctx, jobs)
	if err != nil {
		return nil, err
	}
	out := &ImagesOutcome{Steps: outcome.Steps}
	for i, r := range outcome.Results {
		img := s.plan.Images[i]
		out.Images = append(out.Images, ImageResult{Name: img.Name, Ref: img.Ref, Digest: r.Digest, Path: r.Dest, Platforms: s.plan.PlatformIDs()})
	}
	if !opts.SkipChecks {
		if out.Checks, err = quickChecksOnce(opts, s.plan, out.Images); err != nil {
			return nil, err
		}
	}
	if out.Explanations, err = record(opts, s.graph, out.Steps); err != nil {
		return nil, err
	}
	if s.goCacheTo != "" {
		if out.GoCache, err = s.publishGoCache(ctx, s.goCacheTo, s.goCacheMax); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// PlatformDir is the output folder name of a platform: linux_amd64, linux_arm_v7.
func PlatformDir(p ocispec.Platform) string {
	return strings.ReplaceAll(config.FormatPlatform(p), "/", "_")
}

// BinariesOutcome is where Binaries wrote and which steps ran.
type BinariesOutcome struct {
	Dir string
	buildkit.Steps
	// GoCache is the Go cache snapshot published, when asked for.
	GoCache *GoCacheResult
}

// Binaries builds every configured binary for every platform and writes
// them to <out>/bin/<os>_<arch>/<name>.
func Binaries(ctx context.Context, opts Options) (*BinariesOutcome, error) {
	s, err := start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.close()
	var files []fileCopy
	for _, target := range s.plan.Platforms {
		for _, b := range s.plan.Binaries {
			files = append(files, fileCopy{from: s.binary(b.Name, target), src: "/" + b.Name, dest: "/" + PlatformDir(target) + "/" + b.Name})
		}
	}
	dest := filepath.Join(opts.outDir(s.plan.Root), "bin")
	steps, err := s.exportFiles(ctx, "binaries", files, dest)
	if err != nil {
		return nil, err
	}
	out := &BinariesOutcome{Dir: dest, Steps: steps}
	if s.goCacheTo != "" {
		if out.GoCache, err = s.publishGoCache(ctx, s.goCacheTo, s.goCacheMax); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fileCopy is one file of a directory export.
type fileCopy struct {
	from      llb.State
	src, dest string
}

// exportFiles solves the files into one directory and writes it to dest,
// replacing what was there only when the solve succeeded.
func (s *session) exportFiles(ctx context.Context, name string, files []fileCopy, dest string) (buildkit.Steps, error) {
	var fa *llb.FileAction
	for _, f := range files {
		opt := &llb.CopyInfo{CreateDestPath: true, Mode: &llb.ChmodOpt{Mode: 0o755}}
		if fa == nil {
			fa = llb.Copy(f.from, f.src, f.dest, opt)
		} else {
			fa = fa.Copy(f.from, f.src, f.dest, opt)
		}
	}
	st := llb.Scratch().File(fa, llb.WithCustomNamef("[%s] collect", name))
	job := buildkit.Job{
		Name: name,
		Build: func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
			def, err := st.Marshal(ctx)
			if err != nil {
				return nil, err
			}
			return c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB(), CacheImports: cacheImports(c)})
		},
		Export: client.ExportEntry{Type: client.ExporterLocal},
		Dest:   dest,
	}
	out, err := s.daemon.Solve(ctx, []buildkit.Job{job}, s.solveOptions())
	if err != nil {
		return nil, err
	}
	return out.Steps, nil
}
