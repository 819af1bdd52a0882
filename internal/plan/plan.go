// Package plan owns the second stage of the flow: it reads the host facts
// once (git head and stamp, go env of the module settings: Host), and
// resolves a validated configuration against the repository (stamp, source
// date, platforms, the one Go environment, each binary's package file set)
// into the Plan that the LLB stage builds.
package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/config"
)

// Plan is the resolved build: everything the LLB stage needs, nothing it
// has to look up again.
type Plan struct {
	Root  string `json:"-"`
	lists listCache
	// host are the host facts the plan was resolved with.
	host *Host
	// goEnvConfig is kiln.yaml's go.env, which the listings take as the
	// compile does.
	goEnvConfig map[string]string
	// Reads are what the go list runs read, for no-op builds to check.
	Reads           Reads              `json:"-"`
	Module          string             `json:"module"`
	Toolchain       Toolchain          `json:"toolchain"`
	BuildPlatform   ocispec.Platform   `json:"-"`
	Platforms       []ocispec.Platform `json:"-"`
	GoEnv           GoEnv              `json:"goEnv"`
	Binaries        []Binary           `json:"binaries"`
	Images          []Image            `json:"images"`
	Stamp           Stamp              `json:"stamp"`
	SourceDateEpoch int64              `json:"sourceDateEpoch"`
	Cache           config.Cache       `json:"cache"`
	// Signing is kiln.yaml's signing section, as written.
	Signing config.Signing `json:"signing"`
	// Release is what a release publishes: image platforms and assets.
	Release config.Release `json:"release"`
	// Builders are the daemons' preferred platforms (package spread).
	Builders []config.Builder `json:"builders,omitempty"`
	// Source is the repository URL for the image source label.
	Source string `json:"source"`
	// Repository prefixes image names: <repository>/<image>:<tag>.
	Repository string `json:"repository"`
	// Budgets are the size budgets in bytes, by binary.
	Budgets map[string]int64 `json:"budgets,omitempty"`
	// Modules are the module@version pairs the binaries import, downloaded
	// in their own step; empty when they use the standard library only or
	// come from vendor/.
	Modules []string `json:"modules"`
	// Std are the standard-library packages the binaries import, by target
	// platform (FormatPlatform): compiled while the modules download.
	Std map[string][]string `json:"std,omitempty"`
	// ModMode is how compiles find modules: vendor, readonly or mod (go's -mod).
	ModMode string `json:"modMode"`
	// ModModeFrom says what chose ModMode, for the plan and errors.
	ModModeFrom string `json:"modModeFrom"`
	// Workspace is true when Root's go.work drives the build.
	Workspace bool `json:"workspace"`
	// Revision is the commit for image labels: the real one even in
	// development builds, since labels change only the image config, never
	// a binary. Empty outside git.
	Revision string `json:"revision"`
	// ModFileHashes are the sha256 of each of ModFiles, read once here so
	// no later stage reads go.mod again.
	ModFileHashes map[string]string `json:"modFileHashes"`
	// StampUnused are the stamp variables in packages no binary imports:
	// the linker ignores them silently.
	StampUnused []string `json:"stampUnused,omitempty"`
	// Untracked are files a stamped build reads that git does not track;
	// the tree is then stamped dirty.
	Untracked []string `json:"untracked,omitempty"`
	// ModFiles are the go.mod, go.sum, go.work and go.work.sum files
	// (Root-relative) the module download step reads, and nothing else.
	ModFiles []string `json:"modFiles"`
}

// Toolchain is the pinned Go toolchain for the build platform.
type Toolchain struct {
	GoVersion string `json:"goVersion"`
	// Module is the golang.org/toolchain module version, e.g. v0.0.1-go1.26.8.linux-amd64.
	Module string `json:"module"`
	SHA256 string `json:"sha256"`
}

// GoEnv is the one Go environment of every compile; only GOOS, GOARCH and
// GOARM are added per platform.
type GoEnv struct {
	Env       []string `json:"env"`
	BuildArgs []string `json:"buildArgs"`
}

// Binary is a binary with the source files its compile step sees.
type Binary struct {
	Name    string `json:"name"`
	Package string `json:"package"`
	// Module is the main (or workspace) module the package belongs to.
	Module string `json:"module"`
	// Files are the repository-relative files of its main-module packages
	// (plus go.mod and go.sum); editing another file does not rebuild it.
	Files []string `json:"files"`
	// ExecName is the file name `go build -o DIR/` gives the binary (before
	// .exe): the last element of its import path, or the one before a
	// major version suffix.
	ExecName string `json:"execName"`
}

// Image is an image to assemble.
type Image struct {
	config.Image
	Name string `json:"name"`
	Ref  string `json:"ref"`
	// Targets are its platforms: the build's, narrowed by image.yaml.
	Targets []ocispec.Platform `json:"-"`
}

// PlatformIDs returns the image's platforms as strings, in index order.
func (img Image) PlatformIDs() []string {
	ids := make([]string, len(img.Targets))
	for i, plat := range img.Targets {
		ids[i] = config.FormatPlatform(plat)
	}
	return ids
}

// Stamp is what the linker writes into the version package.
type Stamp struct {
	Release   bool   `json:"release"`
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	TreeState string `json:"treeState"`
	// LDFlags are the -X flags, identical for every binary.
	LDFlags []string `json:"ldflags"`
}

// Options adjust a plan without editing the configuration.
type Options struct {
	// ListCache is a folder where go list answers are kept for the next
	// plan of the same tree; none when empty.
	ListCache string
	// ListGo is the go command that lists the packages: the pinned
	// toolchain's where it runs on this machine, so that another Go on the
	// host changes neither the plan nor a step. The go on PATH when empty.
	ListGo string
	// Platforms replaces the configured target platforms when non-empty.
	Platforms []ocispec.Platform
	// Stamp stamps git describe, commit and tree state (release builds).
	Stamp bool
	// BuildPlatform is the platform compiles run on; the host's by default.
	BuildPlatform *ocispec.Platform
	// Images limits the plan to these images; all when empty.
	Images []string
	// Host are the host facts (git, go env) read before the plan; Resolve
	// reads them itself when nil.
	Host *Host
	// BinaryPlatforms are more platforms the binaries are built for, beside
	// the images' (release assets for darwin and windows): their files and
	// modules are inputs too.
	BinaryPlatforms []ocispec.Platform
}

// TargetEnv is what differs between the compiles of one build: GOOS,
// GOARCH and, for arm, GOARM.
func TargetEnv(target ocispec.Platform) []string {
	env := []string{"GOOS=" + target.OS, "GOARCH=" + target.Architecture}
	if goarm := config.GOARM(target); goarm != "" {
		env = append(env, "GOARM="+goarm)
	}
	return env
}

// Dev stamp values: stable, so a commit does not relink every binary.
const (
	devVersion   = "v0.0.0-dev"
	devCommit    = "unknown"
	devTreeState = "unknown"
)

// values are what each of config.StampValues stamps: stable stand-ins in
// development builds, the real ones in release builds.
func (s Stamp) values(sourceDate int64) map[string]string {
	short, status, date := s.Commit, "unreleased", "1970-01-01T00:00:00Z"
	if len(short) > 12 {
		short = short[:12]
	}
	if s.Release {
		status, date = "released", time.Unix(sourceDate, 0).UTC().Format(time.RFC3339)
	}
	return map[string]string{"version": s.Version, "commit": s.Commit, "shortCommit": short, "treeState": s.TreeState, "releaseStatus": status, "date": date}
}

// Resolve turns a configuration into a plan.
func Resolve(root string, cfg *config.Config, opts Options) (*Plan, error) {
	if drift := cfg.Drift(); len(drift) > 0 {
		d := drift[0]
		return nil, fmt.Errorf("%s: %s: %s, which splits the Go build cache: %s; fix: %s (`mage doctor` lists all %d findings)", config.File, d.Field, d.Problem, d.Cost, d.Fix, len(drift))
	}
	p := &Plan{Root: root, Cache: cfg.Cache, Platforms: cfg.ParsedPlatforms, Source: cfg.Source, Repository: cfg.Repository, Signing: cfg.Signing, Release: cfg.Release, Builders: cfg.Builders, Budgets: map[string]int64{}, lists: listCache{dir: opts.ListCache, gocmd: opts.ListGo}}
	p.host, p.goEnvConfig = opts.Host, cfg.Go.Env
	if p.host == nil {
		p.host = ReadHost(root, opts.ListCache, opts.Stamp, nil)
	} else if opts.Stamp && !p.host.Git.Stamped {
		return nil, fmt.Errorf("plan: a stamped build needs host facts read for stamping")
	}
	for name, size := range cfg.Budgets {
		p.Budgets[name], _ = config.ParseSize(size) // validated by config.Load
	}
	if len(opts.Platforms) > 0 {
		p.Platforms = opts.Platforms
	}
	for _, plat := range p.Platforms {
		if plat.OS != "linux" {
			return nil, fmt.Errorf("platform %s: images are linux only", config.FormatPlatform(plat))
		}
	}
	p.BuildPlatform = ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if opts.BuildPlatform != nil {
		p.BuildPlatform = *opts.BuildPlatform
	}
	if err := p.resolveToolchain(cfg); err != nil {
		return nil, err
	}
	if err := p.resolveModules(cfg); err != nil {
		return nil, err
	}
	if err := p.resolveStamp(cfg, opts.Stamp); err != nil {
		return nil, err
	}
	p.GoEnv = goEnv(cfg, p.Stamp, p.ModMode)
	imported, err := p.resolveBinaries(cfg, opts.BinaryPlatforms)
	if err != nil {
		return nil, err
	}
	for _, kv := range cfg.Stamp.StampVariables() {
		if pkg := kv[0][:strings.LastIndex(kv[0], ".")]; !imported[pkg] {
			p.StampUnused = append(p.StampUnused, kv[0])
		}
	}
	for _, img := range cfg.Images {
		if len(opts.Images) > 0 && !slices.Contains(opts.Images, img.Name) {
			continue
		}
		pi := Image{Image: img, Name: img.Name, Ref: fmt.Sprintf("%s/%s:%s", cfg.Repository, img.Name, cfg.Tag)}
		for _, target := range p.Platforms {
			if len(img.Platforms) == 0 || slices.Contains(img.Platforms, config.FormatPlatform(target)) {
				pi.Targets = append(pi.Targets, target)
			}
		}
		if len(pi.Targets) == 0 {
			return nil, fmt.Errorf("%s/%s: platforms: %s builds none of %s", img.Dir, config.ImageYAML, img.Name, strings.Join(p.PlatformIDs(), ", "))
		}
		p.Images = append(p.Images, pi)
	}
	for _, want := range opts.Images {
		if !slices.ContainsFunc(cfg.Images, func(i config.Image) bool { return i.Name == want }) {
			return nil, fmt.Errorf("unknown image %q (images are the folders of %s/)", want, config.ImagesDir)
		}
	}
	if opts.Stamp {
		// A tree holding files the commit does not is not that commit.
		if p.Untracked = p.untracked(); len(p.Untracked) > 0 && p.Stamp.TreeState == "clean" {
			p.Stamp.TreeState = "dirty"
			p.stampFlags(cfg)
			p.GoEnv = goEnv(cfg, p.Stamp, p.ModMode)
		}
	}
	return p, nil
}

// PlatformIDs returns the target platforms as strings, in index order.
func (p *Plan) PlatformIDs() []string {
	ids := make([]string, len(p.Platforms))
	for i, plat := range p.Platforms {
		ids[i] = config.FormatPlatform(plat)
	}
	return ids
}

// Binary returns the planned binary of that name.
func (p *Plan) Binary(name string) *Binary {
	for i := range p.Binaries {
		if p.Binaries[i].Name == name {
			return &p.Binaries[i]
		}
	}
	return nil
}

func (p *Plan) resolveToolchain(cfg *config.Config) error {
	tc, err := PinnedToolchain(cfg, p.BuildPlatform)
	p.Toolchain = tc
	return err
}

// PinnedToolchain is the toolchain build/kiln.yaml pins for a build platform.
func PinnedToolchain(cfg *config.Config, buildPlatform ocispec.Platform) (Toolchain, error) {
	bp := config.FormatPlatform(buildPlatform)
	sum, ok := cfg.Toolchain.SHA256[bp]
	if !ok {
		return Toolchain{}, fmt.Errorf("%s: toolchain.sha256: no pin for build platform %s (the BuildKit worker's); add the sha256 of golang.org/toolchain@%s", config.File, bp, toolchainModule(cfg.Toolchain.Go, buildPlatform))
	}
	return Toolchain{GoVersion: cfg.Toolchain.Go, Module: toolchainModule(cfg.Toolchain.Go, buildPlatform), SHA256: sum}, nil
}

func toolchainModule(goVersion string, plat ocispec.Platform) string {
	return fmt.Sprintf("v0.0.1-go%s.%s-%s", goVersion, plat.OS, plat.Architecture)
}

// The settings every go command kiln runs has, whatever it builds: no cgo
// (invariant 1), and the go it was given, never a toolchain switch. Every
// step and listing takes them from here.
const (
	CgoOff         = "CGO_ENABLED=0"
	LocalToolchain = "GOTOOLCHAIN=local"
)

// NoDWARF is in the build flags when the link flags drop DWARF: the
// compiler need not make what the linker throws away, 11% of a cold
// compile's CPU. The binaries are the same but for this flag in their
// build information (go version -m). A go.gcflags comes after it and
// replaces it for the packages its pattern matches, which then carry
// DWARF again; a -gcflags in go.env's GOFLAGS leaves it out.
const NoDWARF = "-gcflags=all=-dwarf=false"

// linkDropsDWARF says whether link flags drop DWARF: the last -w says, and
// without one -s does (Go 1.22 on).
func linkDropsDWARF(ldflags []string) bool {
	s, w, sawW := false, false, false
	for _, f := range ldflags {
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(f, "-"), "-"), "=")
		on := true
		if hasValue {
			b, err := strconv.ParseBool(value)
			on = err == nil && b
		}
		switch name {
		case "s":
			s = on
		case "w":
			w, sawW = on, true
		}
	}
	if sawW {
		return w
	}
	return s
}

// goEnv derives the one Go environment. Keep it the only place that does;
// TargetEnv adds the only values that differ between compiles, and the LLB
// stage adds the paths inside its steps (GOCACHE, GOWORK…).
func goEnv(cfg *config.Config, stamp Stamp, modMode string) GoEnv {
	goflags := "-mod=" + modMode
	if v := WithoutModFlag(cfg.Go.Env["GOFLAGS"]); v != "" {
		goflags = v + " " + goflags
	}
	env := []string{
		CgoOff,
		LocalToolchain,
		"GOFLAGS=" + goflags,
		"GOPROXY=off",
		"GOSUMDB=off",
	}
	for _, k := range slices.Sorted(maps.Keys(cfg.Go.Env)) {
		if k != "GOFLAGS" && k != "CGO_ENABLED" {
			env = append(env, k+"="+cfg.Go.Env[k])
		}
	}
	args := []string{"-trimpath", "-buildvcs=false"}
	args = append(args, cfg.Go.Flags...)
	if len(cfg.Go.Tags) > 0 {
		args = append(args, "-tags="+strings.Join(cfg.Go.Tags, ","))
	}
	ld := strings.Fields(cfg.Go.LDFlags)
	// A -gcflags in GOFLAGS comes before the command line's: ours would
	// replace it for every package.
	if linkDropsDWARF(ld) && !strings.Contains(cfg.Go.Env["GOFLAGS"], "-gcflags") {
		args = append(args, NoDWARF)
	}
	if cfg.Go.GCFlags != "" {
		args = append(args, "-gcflags="+cfg.Go.GCFlags)
	}
	// The Go build ID stays: it is a hash of the link's inputs and output,
	// the same on every machine, and it is how go build knows a binary it
	// linked before is up to date, so an edit relinks only what it reaches.
	ld = append(ld, stamp.LDFlags...)
	args = append(args, "-ldflags="+strings.Join(ld, " "))
	return GoEnv{Env: env, BuildArgs: args}
}

func (p *Plan) resolveStamp(cfg *config.Config, release bool) error {
	p.Stamp = Stamp{Release: release, Version: devVersion, Commit: devCommit, TreeState: devTreeState}
	git := p.host.Git
	if git.Err == nil {
		p.Revision = git.Commit
	}
	if env := os.Getenv("SOURCE_DATE_EPOCH"); env != "" {
		n, perr := strconv.ParseInt(env, 10, 64)
		if perr != nil || n < 0 {
			return fmt.Errorf("SOURCE_DATE_EPOCH=%q: not a non-negative integer of seconds", env)
		}
		p.SourceDateEpoch = n
	} else if git.Err == nil {
		p.SourceDateEpoch = git.Time
	}
	if release {
		if git.Err != nil {
			return fmt.Errorf("stamping needs git: %w", git.Err)
		}
		p.Stamp.Commit = git.Commit
		p.Stamp.TreeState = "clean"
		if git.DirtyErr != nil {
			return git.DirtyErr
		} else if git.Dirty {
			p.Stamp.TreeState = "dirty"
		}
		if git.VersionErr != nil {
			return git.VersionErr
		}
		p.Stamp.Version = git.Version
	}
	p.stampFlags(cfg)
	return nil
}

// stampFlags writes the -X flags of the stamp's values.
func (p *Plan) stampFlags(cfg *config.Config) {
	values := p.Stamp.values(p.SourceDateEpoch)
	p.Stamp.LDFlags = nil
	for _, kv := range cfg.Stamp.StampVariables() {
		p.Stamp.LDFlags = append(p.Stamp.LDFlags, "-X "+kv[0]+"="+values[kv[1]])
	}
}

// UntrackedOf are those of the files (relative to the root, with slashes)
// that git does not track, in order.
func (p *Plan) UntrackedOf(files []string) []string {
	var out []string
	for _, f := range files {
		if p.host.Git.Tracked != nil && !p.host.Git.Tracked[f] {
			out = append(out, f)
		}
	}
	return out
}

// untracked are the files the build reads that git does not track, for a
// stamped build: a tree holding them is not the commit it names.
func (p *Plan) untracked() []string {
	tracked := p.host.Git.Tracked
	if tracked == nil {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	note := func(rel string) {
		if !tracked[rel] && !seen[rel] {
			seen[rel] = true
			out = append(out, rel)
		}
	}
	for _, b := range p.Binaries {
		for _, f := range b.Files {
			note(f)
		}
	}
	for _, img := range p.Images {
		note(path.Join(img.Dir, config.ImageYAML))
		for _, f := range img.Files {
			src := filepath.Join(p.Root, filepath.FromSlash(img.Dir), filepath.FromSlash(f.Src))
			filepath.WalkDir(src, func(file string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					if rel, err := filepath.Rel(p.Root, file); err == nil {
						note(filepath.ToSlash(rel))
					}
				}
				return nil
			})
		}
	}
	slices.Sort(out)
	return out
}

// Created is the source date as the OCI "created" timestamp.
func (p *Plan) Created() time.Time {
	return time.Unix(p.SourceDateEpoch, 0).UTC()
}

func gitDirty(root string) (bool, error) {
	out, err := run(root, nil, "git", "status", "--porcelain", "--untracked-files=no")
	return strings.TrimSpace(out) != "", err
}

// gitDescribe is the release version: the VERSION file, else git describe.
// It names image tags and the release assets directory, so it must be a
// valid tag: no path separators, no "..", no whitespace.
func gitDescribe(root string) (string, error) {
	version, from := "", "VERSION"
	if v, err := os.ReadFile(filepath.Join(root, "VERSION")); err == nil && len(bytes.TrimSpace(v)) > 0 {
		version = strings.TrimSpace(string(v))
	} else {
		out, err := run(root, nil, "git", "describe", "--tags", "--always", "--dirty")
		if err != nil {
			return devVersion, nil
		}
		version, from = strings.TrimSpace(out), "git describe"
	}
	if err := ValidVersion(version); err != nil {
		return "", fmt.Errorf("%s gives the version %q: %w", from, version, err)
	}
	return version, nil
}

var versionRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// ValidVersion checks that a version can be an image tag and a directory name.
func ValidVersion(v string) error {
	if !versionRE.MatchString(v) || strings.Contains(v, "..") {
		return fmt.Errorf("not a valid version: use letters, digits, '.', '_' and '-' (at most 128, no \"..\"), e.g. v1.2.3")
	}
	return nil
}

// run executes a host command and returns stdout; the error carries stderr.
func run(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return stdout.String(), fmt.Errorf("%s %s: %s", name, strings.Join(args, " "), msg)
	}
	return stdout.String(), nil
}

type listedModule struct {
	Path    string
	Version string
	Main    bool
	Dir     string
	GoMod   string
	Replace *listedModule
}

// listedPackage is what go list reports of a package. The file lists are
// every file the compiler and linker read (embedded files are relative to
// Dir and may sit in subdirectories), so they, not a listing of Dir, are the
// binary's inputs.
type listedPackage struct {
	ImportPath string
	Dir        string
	Standard   bool
	// Imports are resolved import paths (the standard library's vendored
	// packages under vendor/): a binary's packages are their closure. Deps
	// lists each package's whole closure, which on a large tree names the
	// same packages hundreds of times over.
	Imports []string
	Module  *listedModule
	Error   *struct{ Err string }

	GoFiles, CgoFiles, CFiles, CXXFiles, MFiles, HFiles, FFiles, SFiles []string
	SwigFiles, SwigCXXFiles, SysoFiles, EmbedFiles                      []string
}

// listFields is the -json field list that fills listedPackage.
const listFields = "ImportPath,Dir,Standard,Imports,Module,Error,GoFiles,CgoFiles,CFiles,CXXFiles,MFiles,HFiles,FFiles,SFiles,SwigFiles,SwigCXXFiles,SysoFiles,EmbedFiles"

// sourceFiles returns every file of the package the go command reads to build it.
func (lp listedPackage) sourceFiles() []string {
	var out []string
	for _, list := range [][]string{lp.GoFiles, lp.CgoFiles, lp.CFiles, lp.CXXFiles, lp.MFiles, lp.HFiles, lp.FFiles, lp.SFiles, lp.SwigFiles, lp.SwigCXXFiles, lp.SysoFiles, lp.EmbedFiles} {
		out = append(out, list...)
	}
	return out
}

// resolveBinaries finds, for every target platform, the main-module
// packages each binary depends on; their files are the binary's inputs.
func (p *Plan) resolveBinaries(cfg *config.Config, extra []ocispec.Platform) (map[string]bool, error) {
	imported := map[string]bool{}
	files := map[string]map[string]bool{}
	modules := map[string]bool{}
	std := map[string]map[string]bool{}
	listGoroot := "" // of the go that listed the packages
	binModule, execName := map[string]string{}, map[string]string{}
	pkgs := make([]string, len(cfg.Binaries))
	for i, b := range cfg.Binaries {
		pkgs[i] = b.Package
		files[b.Name] = map[string]bool{}
		for _, f := range p.ModFiles {
			files[b.Name][f] = true
		}
		if p.ModMode == ModVendor {
			files[b.Name]["vendor/modules.txt"] = true
		}
	}
	tags := ""
	if len(cfg.Go.Tags) > 0 {
		tags = "-tags=" + strings.Join(cfg.Go.Tags, ",")
	}
	targets := slices.Clone(p.Platforms)
	for _, plat := range extra {
		if !slices.ContainsFunc(targets, func(t ocispec.Platform) bool { return config.FormatPlatform(t) == config.FormatPlatform(plat) }) {
			targets = append(targets, plat)
		}
	}
	for _, plat := range targets {
		env := append(append([]string{CgoOff}, TargetEnv(plat)...), p.listEnv()...)
		args := []string{"list", "-e", "-deps", "-json=" + listFields}
		if tags != "" {
			args = append(args, tags)
		}
		out, err := p.lists.run(&p.Reads, p.Root, env, p.packageDeps, append(args, pkgs...)...)
		if err != nil {
			return nil, fmt.Errorf("list packages for %s: %w%s", config.FormatPlatform(plat), err, Hint(err.Error()))
		}
		byPath := map[string]listedPackage{}
		dec := json.NewDecoder(strings.NewReader(out))
		for {
			var lp listedPackage
			if err := dec.Decode(&lp); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("list packages: %w", err)
			}
			if lp.Error != nil {
				return nil, fmt.Errorf("package %s (%s): %s%s", lp.ImportPath, config.FormatPlatform(plat), lp.Error.Err, Hint(lp.Error.Err))
			}
			byPath[lp.ImportPath] = lp
		}
		for _, b := range cfg.Binaries {
			main, ok := p.mainPackage(byPath, b.Package)
			if !ok {
				return nil, fmt.Errorf("%s: binary %q: package %s not found in %s", config.File, b.Name, b.Package, p.Module)
			}
			if main.Module != nil {
				binModule[b.Name] = main.Module.Path
			}
			execName[b.Name] = ExecName(main.ImportPath)
			for _, dep := range closure(byPath, main.ImportPath) {
				imported[dep] = true
				lp := byPath[dep]
				if lp.Standard {
					if listGoroot == "" && lp.Dir != "" {
						listGoroot = strings.TrimSuffix(filepath.ToSlash(lp.Dir), "/src/"+dep)
					}
					id := config.FormatPlatform(plat)
					if std[id] == nil {
						std[id] = map[string]bool{}
					}
					std[id][dep] = true
				}
				if lp.Standard || lp.Module == nil {
					continue
				}
				// Main-module, vendored and replaced-by-directory packages
				// are files of the repository: inputs of the binary.
				if _, inside := within(p.Root, lp.Dir); inside && lp.Dir != "" {
					if err := addPackageFiles(p.Root, lp, files[b.Name]); err != nil {
						return nil, err
					}
					continue
				}
				m := lp.Module
				if m.Replace != nil {
					m = m.Replace
				}
				if m.Main || m.Version == "" {
					return nil, fmt.Errorf("binary %q: package %s is in %s, outside %s; BuildKit sees only the repository: move it under the repository or replace it with a module version", b.Name, lp.ImportPath, lp.Dir, p.Root)
				}
				modules[m.Path+"@"+m.Version] = true
			}
		}
	}
	for _, b := range cfg.Binaries {
		p.Binaries = append(p.Binaries, Binary{Name: b.Name, Package: b.Package, Module: binModule[b.Name], Files: sortedSet(files[b.Name]), ExecName: execName[b.Name]})
	}
	p.Modules = sortedSet(modules)
	// Another Go than the pinned toolchain (where that cannot run here, or
	// before it was fetched) has other standard packages: then the go build
	// compiles them itself.
	if gorootVersion(listGoroot) == "go"+p.Toolchain.GoVersion {
		p.Std = map[string][]string{}
		for id, pkgs := range std {
			p.Std[id] = sortedSet(pkgs)
		}
	}
	return imported, nil
}

// gorootVersion is the version in a GOROOT's VERSION file, "" if unreadable.
func gorootVersion(goroot string) string {
	dt, err := os.ReadFile(filepath.Join(filepath.FromSlash(goroot), "VERSION"))
	if goroot == "" || err != nil {
		return ""
	}
	first, _, _ := strings.Cut(string(dt), "\n")
	return strings.TrimSpace(first)
}

// closure is pkg and every package it imports, directly or not, in byPath.
func closure(byPath map[string]listedPackage, pkg string) []string {
	seen := map[string]bool{pkg: true}
	out := []string{pkg}
	for i := 0; i < len(out); i++ {
		for _, imp := range byPath[out[i]].Imports {
			if !seen[imp] {
				seen[imp] = true
				out = append(out, imp)
			}
		}
	}
	return out
}

// packageDeps are what go list -deps reads in the repository: the module
// files, and the directory of every package there (with every folder under
// it when the package embeds files).
func (p *Plan) packageDeps(out string) (dirs, files []string) {
	dirs, files = p.moduleDeps("")
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var lp listedPackage
		if dec.Decode(&lp) != nil {
			break
		}
		if _, inside := within(p.Root, lp.Dir); !inside || lp.Dir == "" || lp.Standard {
			continue
		}
		if len(lp.EmbedFiles) > 0 {
			dirs = append(dirs, subdirs(lp.Dir)...)
		} else {
			dirs = append(dirs, lp.Dir)
		}
		if m := lp.Module; m != nil && m.Replace != nil && m.Replace.GoMod != "" {
			if _, inside := within(p.Root, m.Replace.GoMod); inside {
				files = append(files, m.Replace.GoMod)
			}
		}
	}
	slices.Sort(dirs)
	return slices.Compact(dirs), existing(files)
}

// ExecName is the go command's name for a main package's executable
// (cmd/go's load.DefaultExecName in module mode).
func ExecName(importPath string) string {
	elem := path.Base(importPath)
	if elem != importPath && isVersionElement(elem) {
		elem = path.Base(path.Dir(importPath))
	}
	return elem
}

// isVersionElement reports whether s is a major version suffix: v2, v3, ….
func isVersionElement(s string) bool {
	if len(s) < 2 || s[0] != 'v' || s[1] == '0' || s[1] == '1' && len(s) == 2 {
		return false
	}
	for _, c := range s[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// mainPackage finds a binary's package by its directory, else by import path.
func (p *Plan) mainPackage(byPath map[string]listedPackage, rel string) (listedPackage, bool) {
	dir := filepath.Join(p.Root, filepath.FromSlash(rel))
	for _, lp := range byPath {
		if lp.Dir == dir && lp.Module != nil {
			return lp, true
		}
	}
	lp, ok := byPath[strings.TrimPrefix(rel, "./")]
	return lp, ok
}

// addPackageFiles adds the files go reads to build one package, and the
// go.mod of a module replaced by a directory inside the repository.
func addPackageFiles(root string, lp listedPackage, into map[string]bool) error {
	names := lp.sourceFiles()
	paths := make([]string, 0, len(names)+1)
	for _, name := range names {
		paths = append(paths, filepath.Join(lp.Dir, filepath.FromSlash(name)))
	}
	if m := lp.Module; m != nil && m.Replace != nil && m.Replace.GoMod != "" {
		if _, inside := within(root, m.Replace.GoMod); inside {
			paths = append(paths, m.Replace.GoMod)
		}
	}
	for _, path := range paths {
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		into[filepath.ToSlash(rel)] = true
	}
	return nil
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
