package golang

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/patternmatcher"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/tonistiigi/fsutil"

	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/plan"
)

// ModuleLayerDir is where compile steps mount the module layer, and
// ToolsDir where the step that builds kiln's step tool writes it. A record
// described as a mount of one of them is that layer or that tool: prune
// (package managed) keeps records by these names and paths.
const (
	ModuleLayerDir = "/go/pkg/mod"
	ToolsDir       = "/kiln/tools"
	// StdDir is the (empty) output of a step that compiled a platform's
	// standard library into GOCACHE; the go build mounts it to wait for it.
	StdDir = "/kiln/std"
	// ToolchainStep begins the name of the step that unpacks the toolchain
	// (the description of its record), followed by the Go version.
	ToolchainStep = "[go] toolchain go"
	// VendorStep names the step that unpacks a vendored build's vendor/
	// archive.
	VendorStep = "[go] vendor/"
	// VCSToolsStep names the step that lays out git and ssh for the
	// download step.
	VCSToolsStep = "[go] git and ssh root"
)

// GoTmpCacheID names the cache mount the go steps' /tmp is: go's work
// folders, which go removes when it exits.
const GoTmpCacheID = "kiln-go-tmp"

// IsolatedCachePrefix begins the cache mount id of an isolated rebuild's
// Go build cache (verify:repro, release:verify): a random suffix follows.
const IsolatedCachePrefix = "kiln-repro-gocache-"

// Local source names the solve must map to directories on the client, but
// for the listed ones (LocalSources, LocalModFiles), which SourceMounts
// serves.
const (
	LocalContext = "context"
	// LocalSources begins the name of each local source of Sources.
	LocalSources = "sources"
	// LocalModFiles holds the module files of the download step.
	LocalModFiles  = "go-mod-files"
	LocalToolchain = "go-toolchain"
	LocalCACerts   = "ca-certificates"
	// LocalVendor holds VendorTar, the vendored files a vendored build's
	// binaries read (UseVendorArchive).
	LocalVendor = "go-vendor"
	VendorTar   = "vendor.tar"
	// CABundle is the file of LocalCACerts the download step trusts.
	CABundle = "ca-certificates.crt"
)

// Paths inside every Go step. They are fixed so that no host path reaches a
// cache key or an output.
const (
	goroot     = "/usr/local/go"
	srcDir     = "/src"
	outDir     = "/out"
	keepDir    = "/kiln/keep"
	goCache    = "/root/.cache/go-build"
	goModCache = ModuleLayerDir // buildkit:prune keeps the layer mounted there
	caDir      = "/etc/ssl/certs"
	// workFile is the workspace file of a go.work build.
	workFile = srcDir + "/go.work"
)

// ContextExcludes are never sent to BuildKit, on top of .dockerignore.
var ContextExcludes = []string{".git", "_output"}

// LocalID names the machine and directory a local source comes from, so the
// daemon can reuse a previous transfer. It is stable (the definition must
// marshal to the same bytes every time) and reaches no output: steps that use
// a local source are keyed on its content.
func LocalID(dir string) llb.ConstraintsOpt {
	host, _ := os.Hostname()
	return llb.LocalUniqueID(digest.FromString(host + "\x00" + dir).Encoded()[:24])
}

// Context is the repository as a local source, .dockerignore applied.
func Context(root string, excludes []string) llb.State {
	return llb.Local(LocalContext,
		llb.ExcludePatterns(append(append([]string{}, ContextExcludes...), excludes...)),
		llb.SharedKeyHint("kiln-context"),
		LocalID(root),
		llb.WithCustomName("[context] load build context"))
}

// Toolchain is the pinned toolchain: the archive ToolchainArchive made,
// sent from the client and unpacked once. The unpacked layer is never
// exported to a layer cache (a fresh daemon unpacks the archive faster than
// it pulls 135 MB), and buildkit:prune keeps it.
func Toolchain(tc plan.Toolchain) llb.State {
	archive := llb.Local(LocalToolchain,
		LocalID("go-toolchain"),
		llb.IncludePatterns([]string{ToolchainTar}),
		llb.SharedKeyHint("go-toolchain-"+tc.SHA256),
		llb.WithCustomNamef("[go] toolchain go%s archive", tc.GoVersion))
	return llb.Scratch().File(llb.Copy(archive, "/"+ToolchainTar, "/", &llb.CopyInfo{AttemptUnpack: true}),
		llb.WithoutExportCache(),
		llb.WithCustomNamef("%s%s", ToolchainStep, tc.GoVersion))
}

// Graph holds the shared inputs of every Go step.
type Graph struct {
	Plan      *plan.Plan
	Context   llb.State
	Toolchain llb.State
	// Fetch is how the download step reaches modules.
	Fetch *Fetch
	// Excludes are the context's .dockerignore patterns; the sources obey
	// them too.
	Excludes []string
	// TraceCompiles runs the package steps with -x, so their output shows
	// every package that was compiled rather than found in GOCACHE.
	TraceCompiles bool
	// seeded, when set, is the step that seeded GOCACHE from a snapshot;
	// the package steps wait for it.
	seeded *llb.State
	// toolsGoCache is the Go cache kiln's step tool compiles on: the build's
	// before any seeding, so that a seeded build finds the tool that an
	// unseeded one built (or imported), and a snapshot never reaches it.
	toolsGoCache string
	// tool, when set, is kilnstep sent from the client (UseStepTool).
	tool *llb.State
	// vendorArchive are the files of vendor/ when they come as one archive
	// (UseVendorArchive) rather than in each listed source.
	vendorArchive []string
	vendorSet     string
	// sources are the files of each listed local source defined so far
	// (Sources, the module files), by name.
	sourcesMu sync.Mutex
	sources   map[string][]string
}

// NewGraph wires the toolchain, the context and the module download step;
// excludes are the context's .dockerignore patterns. A nil fetch downloads
// with network and go's defaults.
func NewGraph(p *plan.Plan, context, toolchain llb.State, excludes []string, fetch *Fetch) *Graph {
	if fetch == nil {
		fetch = &Fetch{}
	}
	return &Graph{Plan: p, Context: context, Toolchain: toolchain, Fetch: fetch, Excludes: excludes, toolsGoCache: p.Cache.GoCache}
}

// Modules is the module cache the compile steps read: the output of the
// download step, or empty when the binaries import the standard library
// only or use vendor/. It is wired when a step asks, not with the graph:
// its step runs kilnstep, which UseStepTool changes after NewGraph. The
// same graph gives the same definition each time.
func (g *Graph) Modules() llb.State {
	if len(g.Plan.Modules) == 0 {
		return llb.Scratch()
	}
	return g.downloadModules()
}

// base is the empty root filesystem every Go step runs in, on the build platform.
func (g *Graph) base() llb.State {
	return llb.Scratch().Platform(g.Plan.BuildPlatform)
}

// goModFiles is the go.mod, go.sum and go.work files alone: the only
// repository inputs of the download step. They come as a local source of
// their own, so a build that compiles only never walks the whole context.
func (g *Graph) goModFiles() llb.State {
	files := g.listed(LocalModFiles, "kiln-modfiles", g.Plan.ModFiles, "[go] go.mod and go.sum files")
	return llb.Scratch().File(
		llb.Copy(files, "/", "/", &llb.CopyInfo{CopyDirContentsOnly: true}),
		llb.WithCustomName("[go] go.mod and go.sum"))
}

// fetchBase is the root filesystem of the download step: git and ssh when
// modules may come straight from their repositories, else empty. The tools
// are copied out of their local source: BuildKit keys a local source on the
// session that sent it, so a step with one as its (writable) root would run
// on every build, and a copy is keyed on the files' content.
func (g *Graph) fetchBase() llb.State {
	if g.Fetch.Tools == "" {
		return g.base()
	}
	tools := llb.Local(LocalVCSTools, LocalID(LocalVCSTools), llb.SharedKeyHint(LocalVCSTools),
		llb.WithCustomName("[go] git and ssh"))
	return llb.Scratch().Platform(g.Plan.BuildPlatform).File(
		llb.Copy(tools, "/", "/", &llb.CopyInfo{CopyDirContentsOnly: true}),
		llb.WithCustomName(VCSToolsStep))
}

// ToolStates are the steps that lay out the tools builds run with, and no
// build's work: the unpacked toolchain, and git and ssh when modules may be
// fetched from their VCS.
func (g *Graph) ToolStates() []llb.State {
	states := []llb.State{g.Toolchain}
	if g.Fetch.Tools != "" {
		states = append(states, g.fetchBase())
	}
	return states
}

// downloadModules fetches the binaries' modules with network into the
// persistent module cache, then copies their extracted files (kilnstep
// modules) into a layer of their own, so compiles see exactly the verified
// modules even if the cache mount is pruned later.
func (g *Graph) downloadModules() llb.State {
	mods := g.goModFiles()
	download := []string{goroot + "/bin/go", "mod", "download"}
	gowork := "off"
	if g.Plan.Workspace {
		gowork = workFile
	}
	common := []llb.RunOption{
		llb.Dir(srcDir),
		llb.AddEnv("HOME", "/root"),
		addEnv(plan.LocalToolchain),
		addEnv(plan.CgoOff),
		llb.AddEnv("GOWORK", gowork),
		readOnlyLayer(goroot, g.Toolchain),
		llb.AddMount(srcDir, mods, llb.Readonly),
		llb.AddMount("/tmp", llb.Scratch(), llb.Tmpfs()),
		llb.AddMount(goCache, llb.Scratch(), llb.AsPersistentCacheDir(g.Plan.Cache.GoCache, llb.CacheMountShared)),
	}
	certs := llb.Local(LocalCACerts, llb.IncludePatterns([]string{CABundle}), llb.SharedKeyHint("ca-certificates"), LocalID(LocalCACerts),
		llb.WithCustomName("[go] CA certificates"))
	network := llb.NetModeSandbox
	if g.Fetch.Offline {
		network = llb.NetModeNone
	}
	fetch := []llb.RunOption{
		llb.Args(append(append([]string{}, download...), g.Plan.Modules...)),
		llb.AddEnv("PATH", goroot+"/bin:/usr/bin:/bin"),
		llb.AddEnv("GOMODCACHE", goModCache),
		llb.AddEnv("SSL_CERT_FILE", caDir+"/"+CABundle),
		llb.AddMount(caDir, certs, llb.Readonly),
		llb.AddMount(goModCache, llb.Scratch(), llb.AsPersistentCacheDir(g.Plan.Cache.GoModCache, llb.CacheMountShared)),
		llb.Network(network),
		llb.WithCustomName("[go] go mod download"),
	}
	for _, sec := range fetchSecrets {
		fetch = append(fetch, llb.AddSecret(sec.dest, llb.SecretID(sec.id), llb.SecretOptional, llb.SecretFileOpt(0, 0, 0o400)))
	}
	if g.Fetch.Direct {
		fetch = append(fetch,
			llb.AddSSHSocket(llb.SSHID("default"), llb.SSHSocketTarget(sshAgentSocket), llb.SSHOptional),
			llb.AddEnv("SSH_AUTH_SOCK", sshAgentSocket))
	}
	for _, p := range g.Fetch.Proxies {
		dir := llb.Local(p.Local, LocalID(p.Dir), llb.SharedKeyHint(p.Local), llb.WithCustomNamef("[go] GOPROXY directory %s", p.Mount))
		fetch = append(fetch, llb.AddMount(p.Mount, dir, llb.Readonly))
	}
	for _, kv := range g.Fetch.Env {
		k, v, _ := strings.Cut(kv, "=")
		fetch = append(fetch, llb.AddEnv(k, v))
	}
	fetched := g.fetchBase().Run(append(append([]llb.RunOption{}, common...), fetch...)...)

	const cached = "/cache/mod"
	layerOpts := append([]llb.RunOption{}, common...)
	// The module files alone: `go mod download` from the cache mount as a
	// file:// proxy copied every zip and unzipped it again (13 CPU-s for
	// BuildKit's modules), and no compile reads a zip.
	copyArgs := append([]string{"/kiln/bin/" + StepToolFile, "modules", cached, goModCache}, g.Plan.Modules...)
	layerOpts = append(layerOpts, llb.Args(append(append(copyArgs, "--"), download...)))
	// The fetch step's cache record can outlive the cache mount it filled
	// (a daemon killed mid-build): the layer then downloads what the mount
	// lacks from the fetch step's proxies, still checked against go.sum.
	// Nothing else of the fetch environment comes along: GOPRIVATE would
	// send private modules past the mount to a direct fetch this step
	// cannot do.
	proxy, network := "file://"+cached+"/cache/download", llb.NetModeNone
	if !g.Fetch.Offline {
		network = llb.NetModeSandbox
		proxy += "|" + fetchProxy(g.Fetch.Env)
		layerOpts = append(layerOpts, llb.AddEnv("SSL_CERT_FILE", caDir+"/"+CABundle), llb.AddMount(caDir, certs, llb.Readonly))
	}
	layer := g.base().Run(append(layerOpts,
		llb.AddEnv("GOMODCACHE", goModCache),
		llb.AddEnv("GOPROXY", proxy),
		llb.AddEnv("GOSUMDB", "off"),
		llb.AddEnv("GOFLAGS", "-modcacherw"),
		llb.AddEnv("PATH", goroot+"/bin"),
		// Depend on the fetch step, then read the cache it filled.
		llb.AddMount("/fetched", fetched.Root(), llb.Readonly),
		llb.AddMount(cached, llb.Scratch(), llb.AsPersistentCacheDir(g.Plan.Cache.GoModCache, llb.CacheMountShared), llb.Readonly),
		llb.AddMount("/kiln/bin", g.stepTool(), llb.Readonly),
		llb.Network(network),
		llb.WithCustomName("[go] module layer"),
	)...)
	return layer.AddMount(goModCache, llb.Scratch())
}

// fetchProxy is the GOPROXY of the download step, Go's default when unset.
func fetchProxy(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GOPROXY="); ok && v != "" {
			return v
		}
	}
	return "https://proxy.golang.org,direct"
}

// readOnlyLayer mounts the toolchain or the module layer read-only. Their
// cache keys already follow their content (an unpacked checksummed archive;
// a download checked against go.sum), so BuildKit is told not to checksum
// every file for a second key of each step that reads them: for a large
// module graph that is hundreds of MB read between the module layer and
// the go build.
func readOnlyLayer(dest string, st llb.State) llb.RunOption {
	return llb.AddMount(dest, st, llb.Readonly, llb.ContentCache(llb.MountContentCacheOff))
}

// Sources is the files go reads to build a binary (or a union of binaries)
// alone, so an edit elsewhere in the repository does not change its go
// build step's cache key. It is a local source of its own, which sends
// exactly the listed files (SourceMounts): BuildKit keeps it from build to
// build and receives only what changed, where a copy out of the context
// wrote every file again.
func (g *Graph) Sources(b plan.Binary) llb.State {
	// One kept transfer per binary or set of binaries (two sets sharing one
	// would undo each other's files), which an added file only updates.
	set := digest.FromString(b.Name).Encoded()[:16]
	files := b.Files
	if g.vendorArchive != nil {
		// vendor/modules.txt stays: the folder is where the archive mounts.
		files = slices.DeleteFunc(slices.Clone(files), func(f string) bool {
			return strings.HasPrefix(f, VendorDir+"/") && f != VendorModulesTxt
		})
	}
	return g.listed(LocalSources+"-"+set, "kiln-sources-"+set, files, fmt.Sprintf("[%s] sources", b.Name))
}

// VendorDir is where a vendored build's modules are, in the plan's root.
const VendorDir = "vendor"

// VendorModulesTxt is the file of VendorDir that go checks against go.mod.
const VendorModulesTxt = VendorDir + "/modules.txt"

// UseVendorArchive makes every go step read vendor/ from VendorTar of the
// local source LocalVendor, unpacked once, instead of from each listed
// source: BuildKit's file sync sends one stat per file on every build, 0.2 s
// for the 6,000 vendored files of a large module, and an unchanged archive
// is one stat. It returns the files the archive must hold (VendorFiles).
// Call it before asking for any go step.
func (g *Graph) UseVendorArchive() ([]string, error) {
	files, err := g.VendorFiles()
	if err != nil {
		return nil, err
	}
	g.vendorArchive = files
	// A transfer of its own per repository and set of files, as Sources.
	g.vendorSet = digest.FromString(g.Plan.Root + "\x00" + strings.Join(files, "\x00")).Encoded()[:16]
	return files, nil
}

// VendorFiles are the files of vendor/ that any binary of the plan reads,
// in walk order: one archive serves every go step. A file .dockerignore
// excludes is an error, since go would not find it.
func (g *Graph) VendorFiles() ([]string, error) {
	// ContextExcludes match top-level paths only: without a .dockerignore
	// no file below vendor/ needs matching (8 ms for 6,000 files).
	excludes, err := patternmatcher.New(g.Excludes)
	if err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	files := []string{}
	seen := map[string]bool{}
	for _, b := range g.Plan.Binaries {
		for _, f := range b.Files {
			if !strings.HasPrefix(f, VendorDir+"/") || seen[f] {
				continue
			}
			seen[f] = true
			if len(g.Excludes) > 0 {
				skip, err := excludes.MatchesOrParentMatches(f)
				if err != nil {
					return nil, fmt.Errorf(".dockerignore: %w", err)
				}
				if skip {
					return nil, fmt.Errorf(".dockerignore excludes %s, which go reads to build %s: remove the pattern that matches it", f, b.Name)
				}
			}
			files = append(files, f)
		}
	}
	slices.SortFunc(files, WalkOrder)
	return files, nil
}

// vendorMounts mount the unpacked vendor archive over the sources' vendor/,
// when there is one (UseVendorArchive). Its key is the archive's digest, so
// BuildKit is told not to checksum its files again.
func (g *Graph) vendorMounts() []llb.RunOption {
	if g.vendorArchive == nil {
		return nil
	}
	archive := llb.Local(LocalVendor,
		LocalID(g.Plan.Root+"\x00"+LocalVendor),
		llb.IncludePatterns([]string{VendorTar}),
		llb.SharedKeyHint("kiln-vendor-"+g.vendorSet),
		llb.WithCustomName("[go] vendor/ archive"))
	layer := llb.Scratch().File(llb.Copy(archive, "/"+VendorTar, "/", &llb.CopyInfo{AttemptUnpack: true}),
		llb.WithoutExportCache(),
		llb.WithCustomName(VendorStep))
	return []llb.RunOption{readOnlyLayer(srcDir+"/"+VendorDir, layer)}
}

// listed is a local source named name that holds exactly files of the
// plan's root (SourceMounts), .dockerignore applied.
func (g *Graph) listed(name, sharedKey string, files []string, vertex string) llb.State {
	g.sourcesMu.Lock()
	if g.sources == nil {
		g.sources = map[string][]string{}
	}
	g.sources[name] = files
	g.sourcesMu.Unlock()
	return llb.Local(name,
		llb.ExcludePatterns(append(append([]string{}, ContextExcludes...), g.Excludes...)),
		llb.SharedKeyHint(sharedKey),
		LocalID(g.Plan.Root+"\x00"+name),
		llb.WithCustomName(vertex))
}

// SourceMounts are the local sources of listed files (Sources, the module
// files) defined so far, by name: each holds its files of the plan's root
// and nothing else.
func (g *Graph) SourceMounts() map[string]fsutil.FS {
	g.sourcesMu.Lock()
	defer g.sourcesMu.Unlock()
	mounts := map[string]fsutil.FS{}
	for name, files := range g.sources {
		mounts[name] = newListedFS(g.Plan.Root, files)
	}
	return mounts
}

// Env is the complete environment of a compile step for one platform: the
// plan's one Go environment plus GOOS/GOARCH/GOARM. Nothing of the host's.
func Env(p *plan.Plan, target ocispec.Platform) []string {
	env := []string{
		"PATH=" + goroot + "/bin",
		"HOME=/root",
		"GOCACHE=" + goCache,
		"GOMODCACHE=" + goModCache,
	}
	env = append(env, p.GoEnv.Env...)
	if p.Workspace {
		env = append(env, "GOWORK="+workFile)
	}
	return append(env, plan.TargetEnv(target)...)
}

// PackageStepName is the vertex name of a platform's go build step; explain
// and the tests find the step by it.
func PackageStepName(target ocispec.Platform) string {
	return fmt.Sprintf("[%s] go build", config.FormatPlatform(target))
}

// LinkStepName is the vertex name of the step that takes one binary out of
// its platform's go build: it runs only when that binary's bytes changed.
func LinkStepName(binary string, target ocispec.Platform) string {
	return fmt.Sprintf("[%s %s] binary", binary, config.FormatPlatform(target))
}

// Built is a platform's go build: each binary as a state of its own, and the
// go build step that made it (its GOCACHE holds the binary's packages).
type Built struct {
	Binaries map[string]llb.State
	// Outputs are the go build step's output of each binary, which holds
	// that binary alone, at BinaryPath. A solve that asks for some must
	// ask for all of the step's (see BuildBinaries), or BuildKit keeps no
	// result of the others and runs the step again for them.
	Outputs map[string]llb.State
	// Steps are each binary's go build step, as the merge of all its
	// outputs: what a step that must come after it mounts.
	Steps map[string]llb.State
	// Step is the platform's (first) go build step, as Steps gives it.
	Step llb.State
}

// PlatformDir is the output folder name of a platform: linux_amd64, linux_arm_v7.
func PlatformDir(p ocispec.Platform) string {
	return strings.ReplaceAll(config.FormatPlatform(p), "/", "_")
}

// BinaryPath is where a binary lies in its go build output (Built.Outputs):
// where the binaries target writes it under its folder.
func BinaryPath(b plan.Binary, target ocispec.Platform) string {
	return "/" + PlatformDir(target) + "/" + b.Name
}

// SideBySide is how many platforms' go builds run at once. Their compiles
// and links take turns on the CPU tokens of CPUTokensCacheID, so together
// they run as many at once as one go build would, and peak memory stays
// that of one; but where one platform's build waits on a single compile or
// link (an edit), the other platform's runs on the other CPUs, and the one
// that finishes last has them all. Builds that start cold take turns all
// the same (kilnstep's coldTurn): compiling everything, side by side cost
// 5% more CPU than one after the other.
const SideBySide = 2

// CPUTokensCacheID is the cache mount of the CPU tokens that side-by-side go
// builds share: one per daemon, so that builds running at once share it too.
// It holds empty lock files only.
const CPUTokensCacheID = "kiln-cpu-tokens"

const cpuTokensDir = "/kiln/cpus"

// BuildBinaries builds the binaries for one target platform the way a
// developer does, in one go process: `go build -o DIR/ PKG...`. One process
// compiles every package once and links the binaries side by side, with no
// second process start or package graph load per binary; the step re-runs on
// an edit to any binary's files, as go build would. Each binary then gets a
// step of its own that copies it out: BuildKit keys that copy on the
// binary's content, so the images of binaries whose bytes did not change
// stay cached. Binaries whose executables go would give the same name go
// into one more step each.
//
// side is how many go builds run at once (SideBySide, or fewer platforms),
// and after, when set, is the go build this one waits for: SideBySide
// platforms before it, so that no more run at once.
func (g *Graph) BuildBinaries(bins []plan.Binary, target ocispec.Platform, side int, after *llb.State) Built {
	out := Built{Binaries: map[string]llb.State{}, Outputs: map[string]llb.State{}, Steps: map[string]llb.State{}}
	var groups [][]plan.Binary
	for _, b := range bins {
		placed := false
		for i, grp := range groups {
			if !slices.ContainsFunc(grp, func(o plan.Binary) bool { return o.ExecName == b.ExecName }) {
				groups[i], placed = append(grp, b), true
				break
			}
		}
		if !placed {
			groups = append(groups, []plan.Binary{b})
		}
	}
	for i, grp := range groups {
		name := PackageStepName(target)
		if i > 0 {
			name += fmt.Sprintf(" (%d)", i+1)
		}
		outputs := g.goBuild(grp, i, target, g.Plan.GoEnv.BuildArgs, name, side, after)
		// BuildKit keeps the result of a step's output only in a solve that
		// asked for that output: one that asked for another ran the step
		// again. So a binary is copied out of all of them together (a merge
		// copies no data), and every solve asks for every output.
		all := llb.Merge(outputs)
		if i == 0 {
			out.Step = all
		}
		for j, b := range grp {
			out.Steps[b.Name] = all
			out.Outputs[b.Name] = outputs[j]
			out.Binaries[b.Name] = llb.Scratch().File(
				llb.Copy(all, BinaryPath(b, target), "/"+b.Name),
				llb.WithCustomName(LinkStepName(b.Name, target)))
		}
	}
	return out
}

// ExecFile is the file name go build -o DIR/ gives the binary on target.
func ExecFile(b plan.Binary, target ocispec.Platform) string {
	if target.OS == "windows" {
		return b.ExecName + ".exe"
	}
	return b.ExecName
}

// KeptBinariesCacheID is the cache mount where a platform's go build keeps
// the binaries it linked, beside the Go build cache it belongs with: an
// isolated or seeded Go cache gets its own.
func KeptBinariesCacheID(goCacheID string, target ocispec.Platform) string {
	return goCacheID + "-binaries-" + strings.ReplaceAll(config.FormatPlatform(target), "/", "-")
}

// goBuild is `go build -o DIR/ PKG...` of some binaries for one platform,
// run by kilnstep where the last build's binaries are kept; it has an
// output per binary, in the order of bins, holding it at BinaryPath. A
// binary in an output of its own is exported without a copy.
func (g *Graph) goBuild(bins []plan.Binary, group int, target ocispec.Platform, flags []string, name string, side int, after *llb.State) []llb.State {
	_, union := g.packageArgs(bins)
	var names []string
	for i, b := range bins {
		names = append(names, ExecFile(b, target)+"="+strconv.Itoa(i)+BinaryPath(b, target))
	}
	cpus, tokens := cpuTokens(side)
	args := []string{"/kiln/bin/kilnstep", "gobuild", keepDir, outDir, strings.Join(names, ","), strconv.Itoa(side), cpus, "--", goroot + "/bin/go", "build"}
	if g.TraceCompiles {
		args = append(args, "-x")
	}
	args = append(append(args, flags...), "-o", keepDir+"/")
	for _, b := range bins {
		args = append(args, b.Package)
	}
	// The binaries go linked last time for this platform (and group of
	// binaries): go relinks only those whose inputs changed. Locked: one go
	// build writes there at once. A release links every binary afresh.
	keep := llb.AddMount(keepDir, llb.Scratch(), llb.Tmpfs())
	if !g.Plan.Stamp.Release {
		id := KeptBinariesCacheID(g.Plan.Cache.GoCache, target)
		if group > 0 {
			id += fmt.Sprintf("-%d", group+1)
		}
		keep = llb.AddMount(keepDir, llb.Scratch(), llb.AsPersistentCacheDir(id, llb.CacheMountLocked))
	}
	extra := append([]llb.RunOption{llb.AddMount("/kiln/bin", g.stepTool(), llb.Readonly), keep}, tokens...)
	if g.seeded != nil {
		extra = append(extra, llb.AddMount("/kiln/seeded", *g.seeded, llb.Readonly))
	}
	if after != nil {
		extra = append(extra, llb.AddMount("/kiln/after", *after, llb.Readonly))
	}
	if std, ok := g.standardLibrary(target, side); ok {
		extra = append(extra, llb.AddMount(StdDir, std, llb.Readonly))
	}
	extra = append(extra, g.vendorMounts()...)
	run := g.GoCommand(args, g.Sources(union), target, name, extra...)
	outputs := make([]llb.State, len(bins))
	for i := range bins {
		outputs[i] = run.AddMount(outDir+"/"+strconv.Itoa(i), llb.Scratch())
	}
	return outputs
}

// StdStepName is the vertex name of the step that compiles a platform's
// standard-library packages into GOCACHE while the modules download.
func StdStepName(target ocispec.Platform) string {
	return fmt.Sprintf("[%s] standard library", config.FormatPlatform(target))
}

// standardLibrary compiles the standard-library packages the binaries
// import on target into the shared GOCACHE, with the go build's own flags
// and environment, so the go build finds them there. It needs neither the
// sources nor the modules, so it runs while the modules download, which
// waits on the network: native go build downloads first, then compiles.
// None when nothing downloads (vendored, or the standard library only):
// there it would only split one go build in two.
func (g *Graph) standardLibrary(target ocispec.Platform, side int) (llb.State, bool) {
	pkgs := g.Plan.Std[config.FormatPlatform(target)]
	if len(g.Plan.Modules) == 0 || g.Plan.ModMode == plan.ModVendor || len(pkgs) == 0 {
		return llb.State{}, false
	}
	cpus, tokens := cpuTokens(side)
	args := []string{"/kiln/bin/kilnstep", "gobuild", keepDir, StdDir, "", strconv.Itoa(side), cpus, "--", goroot + "/bin/go", "build"}
	args = append(append(args, StdBuildArgs(g.Plan.GoEnv.BuildArgs)...), pkgs...)
	extra := append([]llb.RunOption{llb.AddMount("/kiln/bin", g.stepTool(), llb.Readonly), llb.AddMount(keepDir, llb.Scratch(), llb.Tmpfs())}, tokens...)
	if g.seeded != nil {
		extra = append(extra, llb.AddMount("/kiln/seeded", *g.seeded, llb.Readonly))
	}
	// Only go.mod and go.work of the sources, so that go sees the build's
	// module or workspace, and no modules.
	run := g.goCommand(args, g.goModFiles(), nil, target, StdStepName(target), extra...)
	return run.AddMount(StdDir, llb.Scratch()), true
}

// StdBuildArgs are the go build flags of the standard-library step: those
// of the go build that reach the standard library's compiles, so that it
// finds them in GOCACHE. -ldflags reach no compile, and they carry the
// commit when stamped. A -gcflags or -asmflags without a pattern applies to
// the packages named on the command line: the go build's binaries, never
// the standard library, which this step names instead. So does -cover
// without -coverpkg (with the main module's packages).
func StdBuildArgs(buildArgs []string) []string {
	coverpkg := slices.ContainsFunc(buildArgs, func(a string) bool {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		return name == "coverpkg"
	})
	var args []string
	for i := 0; i < len(buildArgs); i++ {
		a := buildArgs[i]
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		switch {
		case (name == "ldflags" || name == "covermode" && !coverpkg) && !hasValue:
			i++
			continue
		case name == "ldflags" || (name == "cover" || name == "covermode") && !coverpkg:
			continue
		case (name == "gcflags" || name == "asmflags") && !hasValue && i+1 < len(buildArgs):
			if value = strings.TrimSpace(buildArgs[i+1]); value == "" || strings.HasPrefix(value, "-") {
				i++
				continue
			}
		case (name == "gcflags" || name == "asmflags") && hasValue:
			if value = strings.TrimSpace(value); value == "" || strings.HasPrefix(value, "-") {
				continue
			}
		}
		args = append(args, a)
	}
	return args
}

// cpuTokens is the CPUS argument of kilnstep gobuild and the mount of the
// tokens, for a go build that runs beside side-1 others.
func cpuTokens(side int) (string, []llb.RunOption) {
	if side <= 1 {
		return "-", nil
	}
	return cpuTokensDir, []llb.RunOption{llb.AddMount(cpuTokensDir, llb.Scratch(), llb.AsPersistentCacheDir(CPUTokensCacheID, llb.CacheMountShared))}
}

// packageArgs is the go list command that compiles the binaries' packages,
// and the binary whose files are the union of theirs.
func (g *Graph) packageArgs(bins []plan.Binary) ([]string, plan.Binary) {
	files := map[string]bool{}
	var pkgs []string
	for _, b := range bins {
		pkgs = append(pkgs, b.Package)
		for _, f := range b.Files {
			files[f] = true
		}
	}
	name := "all binaries"
	if len(bins) != len(g.Plan.Binaries) {
		name = strings.Join(binaryNames(bins), ", ")
	}
	union := plan.Binary{Name: name, Files: sortedKeys(files)}
	args := append([]string{goroot + "/bin/go", "list"}, g.Plan.GoEnv.BuildArgs...)
	args = append(args, "-e", "-export", "-deps", "-f", "{{if .Error}}{{.ImportPath}}: {{.Error}}{{end}}")
	return append(args, pkgs...), union
}

// LinkWithSymbols links one binary keeping the symbol table (no -s -w), for
// size reports, after built (its go build step, as Built.Steps gives it)
// filled GOCACHE with its packages, so little more than the link runs (a
// main package go found up to date in the kept binaries is compiled here).
// The result holds the binary at /<name>.
func (g *Graph) LinkWithSymbols(b plan.Binary, built llb.State, target ocispec.Platform) llb.State {
	name := fmt.Sprintf("[%s %s] go build with symbols", b.Name, config.FormatPlatform(target))
	return g.link(b, g.Sources(b), built, target, withSymbols(g.Plan.GoEnv.BuildArgs), name)
}

func (g *Graph) link(b plan.Binary, src, prepared llb.State, target ocispec.Platform, flags []string, name string) llb.State {
	args := append([]string{goroot + "/bin/go", "build"}, flags...)
	args = append(args, "-o", outDir+"/"+b.Name, b.Package)
	run := g.GoCommand(args, src, target, name,
		append(g.vendorMounts(), llb.AddMount("/kiln/prepared", prepared, llb.Readonly))...)
	return run.AddMount(outDir, llb.Scratch())
}

// withSymbols drops -s and -w from the -ldflags argument.
func withSymbols(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if ld, ok := strings.CutPrefix(a, "-ldflags="); ok {
			var kept []string
			for _, f := range strings.Fields(ld) {
				if f != "-s" && f != "-w" {
					kept = append(kept, f)
				}
			}
			a = "-ldflags=" + strings.Join(kept, " ")
		}
		out[i] = a
	}
	return out
}

// GoCommand is a go command on the build platform for one target platform:
// the toolchain, sources, modules and build cache mounted, no network, and
// the environment of Env only. Every compile step is one.
func (g *Graph) GoCommand(args []string, src llb.State, target ocispec.Platform, name string, extra ...llb.RunOption) llb.ExecState {
	modules := g.Modules()
	return g.goCommand(args, src, &modules, target, name, extra...)
}

// goCommand is GoCommand with the modules mounted only when given.
func (g *Graph) goCommand(args []string, src llb.State, modules *llb.State, target ocispec.Platform, name string, extra ...llb.RunOption) llb.ExecState {
	opts := []llb.RunOption{
		llb.Args(args),
		llb.Dir(srcDir),
		readOnlyLayer(goroot, g.Toolchain),
		llb.AddMount(srcDir, src, llb.Readonly),
	}
	if modules != nil {
		opts = append(opts, readOnlyLayer(goModCache, *modules))
	}
	opts = append(opts,
		llb.AddMount(goCache, llb.Scratch(), llb.AsPersistentCacheDir(g.Plan.Cache.GoCache, llb.CacheMountShared)),
		// go's work folder holds every package it compiles until it
		// exits: on disk, as a native build's, not in a tmpfs, which is RAM
		// the machine cannot reclaim. A cache mount, private to the step
		// while it runs: nothing of it is committed as a result.
		llb.AddMount("/tmp", llb.Scratch(), llb.AsPersistentCacheDir(GoTmpCacheID, llb.CacheMountPrivate)),
		llb.Network(llb.NetModeNone),
		llb.WithCustomName(name),
	)
	for _, kv := range Env(g.Plan, target) {
		k, v, _ := strings.Cut(kv, "=")
		opts = append(opts, llb.AddEnv(k, v))
	}
	return g.base().Run(append(opts, extra...)...)
}

func binaryNames(bins []plan.Binary) []string {
	var names []string
	for _, b := range bins {
		names = append(names, b.Name)
	}
	return names
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// addEnv sets one NAME=value setting of package plan in a step.
func addEnv(kv string) llb.StateOption {
	name, value, _ := strings.Cut(kv, "=")
	return llb.AddEnv(name, value)
}
