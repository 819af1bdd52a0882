// Package config owns the first stage of the flow: it loads build/kiln.yaml
// and images/*/image.yaml and validates them, so that every mistake is
// reported with its file and field before BuildKit is contacted.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.yaml.in/yaml/v3"
)

// Paths of the configuration, relative to the repository root.
const (
	File      = "build/kiln.yaml"
	ImagesDir = "images"
	ImageYAML = "image.yaml"
)

// Config is build/kiln.yaml.
type Config struct {
	Toolchain Toolchain `yaml:"toolchain"`
	Platforms []string  `yaml:"platforms"`
	Go        GoEnv     `yaml:"go"`
	Binaries  []Binary  `yaml:"binaries"`
	Stamp     Stamp     `yaml:"stamp"`
	Cache     Cache     `yaml:"cache"`
	// Budgets cap each binary's (stripped) size on every platform, e.g. "4MiB".
	Budgets    map[string]string `yaml:"budgets"`
	Repository string            `yaml:"repository"`
	Tag        string            `yaml:"tag"`
	Source     string            `yaml:"source"`
	Signing    Signing           `yaml:"signing"`
	Release    Release           `yaml:"release"`
	// Builders are daemons a spread build may name in BUILDKIT_HOST, with
	// the platforms each prefers (a native arm64 node for linux/arm64).
	Builders []Builder `yaml:"builders"`

	// Images are read from images/*/image.yaml, sorted by name.
	Images []Image `yaml:"-"`
	// ParsedPlatforms are Platforms, parsed and normalised.
	ParsedPlatforms []ocispec.Platform `yaml:"-"`
}

// Toolchain pins the Go toolchain archive per build platform.
type Toolchain struct {
	Go     string            `yaml:"go"`
	SHA256 map[string]string `yaml:"sha256"`
}

// GoEnv is the one Go environment every binary is compiled with.
type GoEnv struct {
	Tags    []string `yaml:"tags"`
	GCFlags string   `yaml:"gcflags"`
	LDFlags string   `yaml:"ldflags"`
	// Flags are extra `go build` flags, e.g. -pgo=off.
	Flags []string `yaml:"flags"`
	// Env holds the Go variables that are not per platform: GOAMD64,
	// GOARM64, GO386, GOEXPERIMENT, GOFLAGS.
	Env map[string]string `yaml:"env"`
}

// BuildEnvKeys are the variables beside GOOS, GOARCH and GOARM that choose
// which files a build compiles (through build constraints) and how: every
// compile and every listing takes them from go.env, never from the host.
var BuildEnvKeys = []string{"GOAMD64", "GOARM64", "GO386", "GOPPC64", "GORISCV64", "GOEXPERIMENT"}

// goEnvKeys are the variables go.env may set.
var goEnvKeys = append(slices.Clone(BuildEnvKeys), "GOFLAGS", "CGO_ENABLED")

// Binary is one main package kiln builds.
type Binary struct {
	Name    string `yaml:"name"`
	Package string `yaml:"package"`
	// Go overrides the shared Go environment for this binary. Any difference
	// splits the Go build cache; `mage doctor` explains each one, and builds
	// refuse to run until it is gone.
	Go *GoEnv `yaml:"go"`
}

// Stamp names the package whose variables the linker stamps; none is
// stamped when both are empty (the version still labels images).
type Stamp struct {
	// Package is a shorthand: its Version, GitCommit and GitTreeState are
	// stamped with version, commit and treeState.
	Package string `yaml:"package"`
	// Variables maps each -X variable (<import path>.<Name>) to the value it
	// gets: one of StampValues.
	Variables map[string]string `yaml:"variables"`
}

// StampValues are the values a stamp variable can take. Development builds
// stamp stable stand-ins; release builds (-stamp, release) the real ones.
var StampValues = []string{"version", "commit", "shortCommit", "treeState", "releaseStatus", "date"}

// StampVariables returns every -X variable with its value name, sorted.
func (s Stamp) StampVariables() [][2]string {
	vars := map[string]string{}
	if s.Package != "" {
		vars[s.Package+".Version"] = "version"
		vars[s.Package+".GitCommit"] = "commit"
		vars[s.Package+".GitTreeState"] = "treeState"
	}
	maps.Copy(vars, s.Variables)
	var out [][2]string
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		out = append(out, [2]string{k, vars[k]})
	}
	return out
}

// Signing names the cosign key pair a release is signed with. Paths are
// relative to the repository root, or env://VAR; KILN_SIGNING_KEY overrides Key, which
// usually lives outside the repository.
type Signing struct {
	Key       string `yaml:"key" json:"key,omitempty"`
	PublicKey string `yaml:"publicKey" json:"publicKey,omitempty"`
	// Layout is where a release's signatures and attestations go:
	// LayoutTags (the default) or LayoutReferrers.
	Layout string `yaml:"layout" json:"layout,omitempty"`
}

// Signature layouts: cosign's sha256-<hex>.sig and .att tags, which every
// cosign reads; or cosign v3's Sigstore bundles as OCI 1.1 referrers.
const (
	LayoutTags      = "tags"
	LayoutReferrers = "referrers"
)

// Release is what `mage release` publishes: every image for Platforms
// (default: the build's platforms), each binary of Assets as a release
// file for each platform listed under it, and the YAML files of Manifests
// with the images pinned to the digests pushed.
type Release struct {
	Platforms []string            `yaml:"platforms" json:"platforms"`
	Assets    map[string][]string `yaml:"assets" json:"assets,omitempty"`
	// Manifests are YAML files, or folders of them, relative to the
	// repository root (Kubernetes manifests, Helm values); each ships as a
	// release asset under its file name, pinned as images:resolve pins.
	Manifests []string `yaml:"manifests" json:"manifests,omitempty"`
	// ManifestFiles are the files Manifests names, set by Load.
	ManifestFiles []ManifestFile `yaml:"-" json:"-"`
}

// ManifestFile is one YAML file a release ships pinned.
type ManifestFile struct {
	// Path is relative to the repository root, with slashes.
	Path string
	// Name is the release asset's name: the file's name.
	Name string
}

// Builder is a BuildKit daemon's address and the platforms it is given
// first when a build spread over several names it.
type Builder struct {
	Address   string   `yaml:"address" json:"address"`
	Platforms []string `yaml:"platforms" json:"platforms"`
}

// Cache holds the ids of the persistent cache mounts.
type Cache struct {
	GoCache    string `yaml:"gocache"`
	GoModCache string `yaml:"gomodcache"`
	// To and From are BuildKit layer caches, e.g.
	// "type=registry,ref=registry.example/antrea/cache,mode=max".
	To   string `yaml:"to"`
	From string `yaml:"from"`
	// GoCacheTo and GoCacheFrom are registry repositories (HOST[:PORT]/path)
	// for Go build cache snapshots; GoCacheMax caps one (e.g. 2GiB).
	GoCacheTo   string `yaml:"gocacheTo"`
	GoCacheFrom string `yaml:"gocacheFrom"`
	GoCacheMax  string `yaml:"gocacheMax"`
	// GoCacheKey pins the cosign public key (cosign.pub, relative to the
	// repository root) that every snapshot a build seeds from must be
	// signed with; publishing then signs with KILN_GOCACHE_SIGNING_KEY.
	GoCacheKey string `yaml:"gocacheKey"`
	// GoCacheUnsigned lets a build seed from snapshots no pinned key
	// signed: whoever can push to gocacheFrom then chooses compiled
	// packages the build may use (never a release, never the shared cache).
	GoCacheUnsigned bool `yaml:"gocacheUnsigned"`
}

// Image is images/<name>/image.yaml.
type Image struct {
	Binaries   []string          `yaml:"binaries"`
	Entrypoint []string          `yaml:"entrypoint"`
	Args       []string          `yaml:"args"`
	Env        map[string]string `yaml:"env"`
	User       string            `yaml:"user"`
	Workdir    string            `yaml:"workdir"`
	Labels     map[string]string `yaml:"labels"`
	Files      []ImageFile       `yaml:"files"`
	// RootReason says why the image runs as root (user: root or 0); without
	// it, root is refused.
	RootReason string `yaml:"rootReason"`
	// Setuid lists the setuid or setgid files the image may carry from its
	// base, each with why; mage verify refuses any other.
	Setuid []SetuidFile `yaml:"setuid"`
	// Platforms narrows the build's platforms for this image (e.g. a base
	// without linux/arm/v7); every one must be a build platform.
	Platforms []string `yaml:"platforms"`
	// Base is the image this one is built on, pinned by digest
	// (REGISTRY/NAME[:TAG]@sha256:…); scratch when empty. The image
	// inherits its env, entrypoint, args, user, workdir and labels unless
	// image.yaml sets them.
	Base string `yaml:"base"`
	// Bases names a base per platform instead (FORMAT linux/arm64: REF),
	// for bases published one image per architecture; each pinned by
	// digest, one for every platform of the image.
	Bases map[string]string `yaml:"bases"`

	Name string `yaml:"-"` // the folder's name
	Dir  string `yaml:"-"` // the folder, relative to the repository root
}

// SetuidFile allows one setuid or setgid file, for a reason.
type SetuidFile struct {
	Path   string `yaml:"path"`
	Reason string `yaml:"reason"`
}

// ImageFile is an extra file, or a folder of them, copied into the image
// from the repository (Src is relative to the image folder). A folder's contents go under Dest, each file and
// directory with Mode.
type ImageFile struct {
	Src  string `yaml:"src"`
	Dest string `yaml:"dest"`
	Mode string `yaml:"mode"`
	// Dir is set by validation when Src is a folder.
	Dir bool `yaml:"-"`
}

func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func mustEval(path string) string {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		return real
	}
	return path
}

// DefaultUser is the user images run as unless image.yaml says otherwise.
const DefaultUser = "65532:65532"

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*$`)
	versionRE = regexp.MustCompile(`^1\.[0-9]+(\.[0-9]+)?(rc[0-9]+)?$`)
	sha256RE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	userRE    = regexp.MustCompile(`^[0-9]+(:[0-9]+)?$`)
	tagRE     = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	modeRE    = regexp.MustCompile(`^0?[0-7]{3,4}$`)
	// stampVarRE is an -X target: an import path, a dot, an identifier.
	stampVarRE = regexp.MustCompile(`^[^\s=]+\.[A-Za-z_][A-Za-z0-9_]*$`)

	unknownFieldRE = regexp.MustCompile(`^line ([0-9]+): field (\S+) not found in type \S+$`)
)

// Load reads and validates the configuration under the repository root.
func Load(root string) (*Config, error) {
	var c Config
	if err := decodeFile(root, File, &c); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	images, err := loadImages(root)
	if err != nil {
		return nil, err
	}
	for i := range images {
		if err := images[i].validate(&c, root); err != nil {
			return nil, err
		}
	}
	if err := c.Release.findManifests(root); err != nil {
		return nil, err
	}
	if c.Cache.GoCacheKey != "" {
		path := filepath.Join(root, filepath.FromSlash(c.Cache.GoCacheKey))
		if _, err := ReadPublicKey(path); err != nil {
			return nil, fieldErr(File, "cache.gocacheKey", "%v; give the path of the cosign.pub of a key pair from `cosign generate-key-pair`", err)
		}
		c.Cache.GoCacheKey = path
	}
	c.Images = images
	return &c, nil
}

// decodeFile decodes one YAML file strictly: unknown fields, duplicate keys
// and trailing documents are errors that name the file and line.
func decodeFile(root, rel string, v any) error {
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: file not found (run kiln from the repository root)", rel)
		}
		return fmt.Errorf("%s: %w", rel, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: file is empty", rel)
		}
		return fmt.Errorf("%s: %s", rel, yamlMessage(err))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: more than one YAML document", rel)
	}
	return nil
}

// yamlMessage turns yaml.v3's errors into one line without its prefix.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, e := range te.Errors {
			msgs[i] = unknownFieldRE.ReplaceAllString(e, `line $1: unknown field "$2" (check its spelling and indentation)`)
		}
		return strings.Join(msgs, "; ")
	}
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

func fieldErr(file, field, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %s", file, field, fmt.Sprintf(format, args...))
}

func (c *Config) validate() error {
	f := File
	if c.Toolchain.Go == "" {
		return fieldErr(f, "toolchain.go", "missing; set the Go version every binary compiles with, e.g. \"1.26.8\"")
	}
	if !versionRE.MatchString(c.Toolchain.Go) {
		return fieldErr(f, "toolchain.go", "%q is not a Go version such as \"1.26.8\"", c.Toolchain.Go)
	}
	if len(c.Toolchain.SHA256) == 0 {
		return fieldErr(f, "toolchain.sha256", "missing; pin the sha256 of the golang.org/toolchain .zip for each build platform")
	}
	for _, plat := range sortedKeys(c.Toolchain.SHA256) {
		p, err := ParsePlatform(plat)
		if err != nil {
			return fieldErr(f, "toolchain.sha256."+plat, "%v", err)
		}
		if p.OS != "linux" {
			return fieldErr(f, "toolchain.sha256."+plat, "build platforms are linux (BuildKit workers run linux)")
		}
		if !sha256RE.MatchString(c.Toolchain.SHA256[plat]) {
			return fieldErr(f, "toolchain.sha256."+plat, "%q is not 64 lower-case hex digits", c.Toolchain.SHA256[plat])
		}
	}
	if len(c.Platforms) == 0 {
		return fieldErr(f, "platforms", "missing; list at least one target platform, e.g. linux/amd64")
	}
	seen := map[string]bool{}
	for i, s := range c.Platforms {
		p, err := ParsePlatform(s)
		if err != nil {
			return fieldErr(f, fmt.Sprintf("platforms[%d]", i), "%v", err)
		}
		if seen[FormatPlatform(p)] {
			return fieldErr(f, fmt.Sprintf("platforms[%d]", i), "%q listed twice", s)
		}
		seen[FormatPlatform(p)] = true
		c.ParsedPlatforms = append(c.ParsedPlatforms, p)
	}
	if err := c.Go.validate(f, "go"); err != nil {
		return err
	}
	if v, ok := c.Go.Env["CGO_ENABLED"]; ok && v != "0" {
		return fieldErr(f, "go.env.CGO_ENABLED", "kiln builds every binary with CGO_ENABLED=0; remove it")
	}
	if len(c.Binaries) == 0 {
		return fieldErr(f, "binaries", "missing; list the binaries to build with name and package")
	}
	names := map[string]bool{}
	for i, b := range c.Binaries {
		field := fmt.Sprintf("binaries[%d]", i)
		if !nameRE.MatchString(b.Name) {
			return fieldErr(f, field+".name", "%q is not a binary name (lower-case letters, digits, '.', '_', '-')", b.Name)
		}
		if names[b.Name] {
			return fieldErr(f, field+".name", "binary %q listed twice", b.Name)
		}
		names[b.Name] = true
		if !strings.HasPrefix(b.Package, "./") || strings.Contains(b.Package, "..") {
			return fieldErr(f, field+".package", "%q must be a path inside the module starting with ./, e.g. ./cmd/%s", b.Package, b.Name)
		}
		if b.Go != nil {
			if err := b.Go.validate(f, field+".go"); err != nil {
				return err
			}
		}
	}
	for _, name := range sortedKeys(c.Budgets) {
		if _, ok := c.Binary(name); !ok {
			return fieldErr(f, "budgets."+name, "unknown binary %q (known: %s)", name, c.binaryNames())
		}
		if _, err := ParseSize(c.Budgets[name]); err != nil {
			return fieldErr(f, "budgets."+name, "%v", err)
		}
	}
	for _, kv := range c.Stamp.StampVariables() {
		name, value := kv[0], kv[1]
		if !stampVarRE.MatchString(name) {
			return fieldErr(f, "stamp.variables."+name, "not <import path>.<Name>, e.g. example.com/project/pkg/version.Version")
		}
		if !slices.Contains(StampValues, value) {
			return fieldErr(f, "stamp.variables."+name, "unknown value %q (use one of %s)", value, strings.Join(StampValues, ", "))
		}
	}
	if !nameRE.MatchString(c.Cache.GoCache) {
		return fieldErr(f, "cache.gocache", "%q is not a cache id (lower-case letters, digits, '.', '_', '-')", c.Cache.GoCache)
	}
	if !nameRE.MatchString(c.Cache.GoModCache) {
		return fieldErr(f, "cache.gomodcache", "%q is not a cache id (lower-case letters, digits, '.', '_', '-')", c.Cache.GoModCache)
	}
	for _, field := range []struct{ name, value string }{{"cache.to", c.Cache.To}, {"cache.from", c.Cache.From}} {
		if field.value == "" {
			continue
		}
		if _, err := ParseCache(field.value); err != nil {
			return fieldErr(f, field.name, "%v", err)
		}
	}
	if c.Cache.GoCacheMax != "" {
		if _, err := ParseSize(c.Cache.GoCacheMax); err != nil {
			return fieldErr(f, "cache.gocacheMax", "%v", err)
		}
	}
	if c.Cache.GoCache == c.Cache.GoModCache {
		return fieldErr(f, "cache.gomodcache", "must differ from cache.gocache")
	}
	for _, part := range strings.Split(c.Repository, "/") {
		if !nameRE.MatchString(part) {
			return fieldErr(f, "repository", "%q is not a repository name such as \"antrea\" or \"example.com/antrea\"", c.Repository)
		}
	}
	if !tagRE.MatchString(c.Tag) {
		return fieldErr(f, "tag", "%q is not an image tag", c.Tag)
	}
	switch c.Signing.Layout {
	case "":
		c.Signing.Layout = LayoutTags
	case LayoutTags, LayoutReferrers:
	default:
		return fieldErr(f, "signing.layout", "%q is not a layout; use %s (cosign's .sig and .att tags) or %s (cosign v3's Sigstore bundles as OCI referrers)", c.Signing.Layout, LayoutTags, LayoutReferrers)
	}
	if err := c.validateBuilders(); err != nil {
		return err
	}
	return c.Release.validate(c)
}

// validateBuilders checks each builder's address and platforms, and
// normalises the platforms as platforms are.
func (c *Config) validateBuilders() error {
	addresses := map[string]bool{}
	for i := range c.Builders {
		b := &c.Builders[i]
		field := fmt.Sprintf("builders[%d]", i)
		b.Address = strings.TrimSpace(b.Address)
		scheme, _, ok := strings.Cut(b.Address, "://")
		switch {
		case !ok || scheme == "":
			return fieldErr(File, field+".address", "%q is not a daemon address such as tcp://buildkitd-0.buildkitd:1234 or kube-pod://buildkitd-0", b.Address)
		case strings.Contains(b.Address, ","):
			return fieldErr(File, field+".address", "%q holds a comma; name one daemon a builder", b.Address)
		case addresses[b.Address]:
			return fieldErr(File, field+".address", "%q is named by two builders; list its platforms once", b.Address)
		}
		addresses[b.Address] = true
		if len(b.Platforms) == 0 {
			return fieldErr(File, field+".platforms", "missing; list the platforms this daemon builds first, e.g. [linux/arm64]")
		}
		for j, s := range b.Platforms {
			p, err := ParsePlatform(s)
			if err != nil {
				return fieldErr(File, fmt.Sprintf("%s.platforms[%d]", field, j), "%v", err)
			}
			if slices.Contains(b.Platforms[:j], FormatPlatform(p)) {
				return fieldErr(File, fmt.Sprintf("%s.platforms[%d]", field, j), "%q listed twice", s)
			}
			b.Platforms[j] = FormatPlatform(p)
		}
	}
	return nil
}

func (r *Release) validate(c *Config) error {
	f := File
	if len(r.Platforms) == 0 {
		r.Platforms = slices.Clone(c.Platforms)
	}
	seen := map[string]bool{}
	for i, s := range r.Platforms {
		field := fmt.Sprintf("release.platforms[%d]", i)
		p, err := ParsePlatform(s)
		if err != nil {
			return fieldErr(f, field, "%v", err)
		}
		if p.OS != "linux" {
			return fieldErr(f, field, "%q: images are linux only; ship other systems as release.assets", s)
		}
		if seen[FormatPlatform(p)] {
			return fieldErr(f, field, "%q listed twice", s)
		}
		seen[FormatPlatform(p)] = true
		r.Platforms[i] = FormatPlatform(p)
	}
	for _, name := range sortedKeys(r.Assets) {
		if _, ok := c.Binary(name); !ok {
			return fieldErr(f, "release.assets."+name, "unknown binary %q (known: %s)", name, c.binaryNames())
		}
		if len(r.Assets[name]) == 0 {
			return fieldErr(f, "release.assets."+name, "no platforms; list where the binary ships, e.g. [linux/amd64, darwin/arm64], or remove it")
		}
		named := map[string]string{}
		for i, s := range r.Assets[name] {
			field := fmt.Sprintf("release.assets.%s[%d]", name, i)
			p, err := ParsePlatform(s)
			if err != nil {
				return fieldErr(f, field, "%v", err)
			}
			id, file := FormatPlatform(p), AssetName(name, FormatPlatform(p))
			if other, ok := named[file]; ok {
				if other == id {
					return fieldErr(f, field, "%q listed twice", s)
				}
				return fieldErr(f, field, "%s and %s both ship as %s; keep one", other, id, file)
			}
			named[file] = id
			r.Assets[name][i] = id
		}
	}
	return nil
}

// findManifests finds the files of release.manifests, each inside the
// repository and shipped under a name no other asset has.
func (r *Release) findManifests(root string) error {
	f := File
	names := map[string]string{"SHA256SUMS": "the checksums", "SHA256SUMS.sig": "their signature"}
	for bin, platforms := range r.Assets {
		for _, platform := range platforms {
			names[AssetName(bin, platform)] = "the binary " + bin + " for " + platform
		}
	}
	r.ManifestFiles = nil
	for i, m := range r.Manifests {
		field := fmt.Sprintf("release.manifests[%d]", i)
		src := filepath.Join(root, filepath.FromSlash(m))
		if m == "" || filepath.IsAbs(m) || !within(root, src) {
			return fieldErr(f, field, "%q must be a path relative to the repository root that stays inside it, e.g. build/yamls/antrea.yml", m)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return fieldErr(f, field, "%s does not exist", m)
		}
		if real, err := filepath.EvalSymlinks(src); err != nil || !within(mustEval(root), real) {
			return fieldErr(f, field, "%s leads outside the repository", m)
		}
		var files []string
		if !fi.IsDir() {
			files = []string{src}
		} else {
			filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
					files = append(files, p)
				}
				return nil
			})
			if len(files) == 0 {
				return fieldErr(f, field, "%s holds no .yaml or .yml file", m)
			}
		}
		for _, file := range files {
			rel, _ := filepath.Rel(root, file)
			rel = filepath.ToSlash(rel)
			// A link in a folder may not lead out of the repository either.
			if real, err := filepath.EvalSymlinks(file); err != nil || !within(mustEval(root), real) {
				return fieldErr(f, field, "%s leads outside the repository", rel)
			}
			name := filepath.Base(file)
			if other, ok := names[name]; ok {
				return fieldErr(f, field, "%s would ship as %s, as %s does; rename one (release assets are one folder)", rel, name, other)
			}
			names[name] = rel
			r.ManifestFiles = append(r.ManifestFiles, ManifestFile{Path: rel, Name: name})
		}
	}
	return nil
}

// AssetName is the release file of a binary for a platform, as Antrea
// names them: antctl-linux-x86_64, antctl-darwin-arm64,
// antctl-windows-x86_64.exe (a variant is not in the name).
func AssetName(bin, platform string) string {
	parts := strings.Split(platform, "/")
	arch, ok := map[string]string{"amd64": "x86_64", "386": "i386"}[parts[1]]
	if !ok {
		arch = parts[1]
	}
	name := fmt.Sprintf("%s-%s-%s", bin, parts[0], arch)
	if parts[0] == "windows" {
		name += ".exe"
	}
	return name
}

func (g *GoEnv) validate(f, prefix string) error {
	for i, t := range g.Tags {
		if t == "" || strings.ContainsAny(t, ", \t") {
			return fieldErr(f, fmt.Sprintf("%s.tags[%d]", prefix, i), "%q is not a single build tag", t)
		}
		if t == "cgo" {
			return fieldErr(f, fmt.Sprintf("%s.tags[%d]", prefix, i), "kiln builds with CGO_ENABLED=0 for every binary; remove the cgo tag")
		}
	}
	for _, field := range []struct{ name, value string }{{prefix + ".gcflags", g.GCFlags}, {prefix + ".ldflags", g.LDFlags}} {
		for _, bad := range []string{"-linkmode=external", "-extldflags", "-buildid"} {
			if strings.Contains(field.value, bad) {
				return fieldErr(f, field.name, "%q is kiln's to set (build IDs) or needs cgo; remove it", bad)
			}
		}
		for _, flag := range strings.Fields(field.value) {
			if flag == "-B" || strings.HasPrefix(flag, "-B=") {
				return fieldErr(f, field.name, "%q is kiln's to set: the GNU build ID follows Go's, and kiln blanks both in its outputs; remove it", flag)
			}
		}
	}
	for i, flag := range g.Flags {
		field := fmt.Sprintf("%s.flags[%d]", prefix, i)
		if !strings.HasPrefix(flag, "-") {
			return fieldErr(f, field, "%q is not a flag", flag)
		}
		name, _, _ := strings.Cut(strings.TrimLeft(flag, "-"), "=")
		if prefix == "go" && (name == "trimpath" || name == "buildvcs") {
			return fieldErr(f, field, "kiln always builds with -trimpath and -buildvcs=false; remove -%s", name)
		}
		switch name {
		case "o", "ldflags", "gcflags", "tags", "mod", "modfile", "C", "toolexec", "overlay":
			return fieldErr(f, field, "-%s is set by kiln or has its own field; remove it from flags", name)
		}
	}
	for _, k := range sortedKeys(g.Env) {
		if !slices.Contains(goEnvKeys, k) {
			return fieldErr(f, prefix+".env."+k, "%s cannot be set here (allowed: %s; GOOS, GOARCH and GOARM come from platforms)", k, strings.Join(goEnvKeys, ", "))
		}
	}
	return nil
}

// Effective is the Go environment one binary would build with: the shared
// one with the binary's overrides applied.
func (c *Config) Effective(b Binary) GoEnv {
	eff := GoEnv{Tags: c.Go.Tags, GCFlags: c.Go.GCFlags, LDFlags: c.Go.LDFlags, Flags: c.Go.Flags, Env: map[string]string{}}
	for k, v := range c.Go.Env {
		eff.Env[k] = v
	}
	if b.Go == nil {
		return eff
	}
	if b.Go.Tags != nil {
		eff.Tags = b.Go.Tags
	}
	if b.Go.GCFlags != "" {
		eff.GCFlags = b.Go.GCFlags
	}
	if b.Go.LDFlags != "" {
		eff.LDFlags = b.Go.LDFlags
	}
	if b.Go.Flags != nil {
		eff.Flags = b.Go.Flags
	}
	for k, v := range b.Go.Env {
		eff.Env[k] = v
	}
	return eff
}

// Binary returns the binary of that name.
func (c *Config) Binary(name string) (Binary, bool) {
	i := slices.IndexFunc(c.Binaries, func(b Binary) bool { return b.Name == name })
	if i < 0 {
		return Binary{}, false
	}
	return c.Binaries[i], true
}

func (c *Config) binaryNames() string {
	var names []string
	for _, b := range c.Binaries {
		names = append(names, b.Name)
	}
	return strings.Join(names, ", ")
}

func loadImages(root string) ([]Image, error) {
	entries, err := os.ReadDir(filepath.Join(root, ImagesDir))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("%s: %w", ImagesDir, err)
	}
	var images []Image
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.ToSlash(filepath.Join(ImagesDir, e.Name()))
		rel := dir + "/" + ImageYAML
		if _, err := os.Stat(filepath.Join(root, rel)); errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: folder has no %s; add one or remove the folder", dir, ImageYAML)
		}
		var img Image
		if err := decodeFile(root, rel, &img); err != nil {
			return nil, err
		}
		img.Name, img.Dir = e.Name(), dir
		images = append(images, img)
	}
	sort.Slice(images, func(i, j int) bool { return images[i].Name < images[j].Name })
	return images, nil
}

func (img *Image) validate(c *Config, root string) error {
	f := img.Dir + "/" + ImageYAML
	if !nameRE.MatchString(img.Name) {
		return fmt.Errorf("%s: folder name %q is not an image name (lower-case letters, digits, '.', '_', '-')", img.Dir, img.Name)
	}
	if len(img.Binaries) == 0 {
		return fieldErr(f, "binaries", "missing; list the binaries this image carries (known: %s)", c.binaryNames())
	}
	seen := map[string]bool{}
	for i, b := range img.Binaries {
		if _, ok := c.Binary(b); !ok {
			return fieldErr(f, fmt.Sprintf("binaries[%d]", i), "unknown binary %q (known: %s; add it to %s binaries)", b, c.binaryNames(), File)
		}
		if seen[b] {
			return fieldErr(f, fmt.Sprintf("binaries[%d]", i), "binary %q listed twice", b)
		}
		seen[b] = true
	}
	if img.Base != "" {
		if err := checkBase(img.Base); err != nil {
			return fieldErr(f, "base", "%v", err)
		}
	}
	if len(img.Entrypoint) == 0 && !img.HasBase() {
		return fieldErr(f, "entrypoint", "missing; e.g. [/usr/local/bin/%s]", img.Binaries[0])
	}
	if len(img.Entrypoint) > 0 && !strings.HasPrefix(img.Entrypoint[0], "/") {
		return fieldErr(f, "entrypoint[0]", "%q must be an absolute path (images have no shell or PATH lookup guarantees)", img.Entrypoint[0])
	}
	if img.User == "" && !img.HasBase() {
		img.User = DefaultUser
	}
	if img.User == "root" {
		img.User = "0:0"
	}
	if img.User != "" && !userRE.MatchString(img.User) {
		return fieldErr(f, "user", "%q must be numeric uid[:gid] or root (the image has no user database to resolve names)", img.User)
	}
	if uid, _, _ := strings.Cut(img.User, ":"); uid == "0" && strings.TrimSpace(img.RootReason) == "" {
		return fieldErr(f, "user", "%q runs the image as root; say why in rootReason (e.g. \"manages host networking\"), or run as a non-root uid", img.User)
	}
	for i, su := range img.Setuid {
		field := fmt.Sprintf("setuid[%d]", i)
		if !strings.HasPrefix(su.Path, "/") || path.Clean(su.Path) != su.Path {
			return fieldErr(f, field+".path", "%q must be a clean absolute path in the image, e.g. /bin/mount", su.Path)
		}
		if strings.TrimSpace(su.Reason) == "" {
			return fieldErr(f, field+".reason", "missing; say why %s must keep its setuid or setgid bit", su.Path)
		}
	}
	for i, plat := range img.Platforms {
		p, err := ParsePlatform(plat)
		if err != nil {
			return fieldErr(f, fmt.Sprintf("platforms[%d]", i), "%v", err)
		}
		if !slices.ContainsFunc(c.ParsedPlatforms, func(q ocispec.Platform) bool { return FormatPlatform(q) == FormatPlatform(p) }) {
			return fieldErr(f, fmt.Sprintf("platforms[%d]", i), "%s is not among the platforms of %s (%s); an image can only narrow them", FormatPlatform(p), File, strings.Join(c.Platforms, ", "))
		}
	}
	if err := img.validateBases(c, f); err != nil {
		return err
	}
	if img.Workdir == "" && !img.HasBase() {
		img.Workdir = "/"
	}
	if img.Workdir != "" && !strings.HasPrefix(img.Workdir, "/") {
		return fieldErr(f, "workdir", "%q must be an absolute path", img.Workdir)
	}
	for _, k := range sortedKeys(img.Env) {
		if k == "" || strings.ContainsAny(k, "= \t") {
			return fieldErr(f, "env."+k, "%q is not an environment variable name", k)
		}
	}
	for _, k := range sortedKeys(img.Labels) {
		if k == "" {
			return fieldErr(f, "labels", "empty label key")
		}
	}
	reserved := map[string]string{"/etc/passwd": "the generated user database", "/etc/group": "the generated user database"}
	for _, b := range img.Binaries {
		reserved["/usr/local/bin/"+b] = "the binary " + b
	}
	for i, file := range img.Files {
		field := fmt.Sprintf("files[%d]", i)
		// Relative to the image folder, and anywhere in the repository:
		// projects keep their scripts elsewhere (build/images/scripts/).
		src := filepath.Join(root, img.Dir, file.Src)
		if file.Src == "" || filepath.IsAbs(file.Src) || !within(root, src) {
			return fieldErr(f, field+".src", "%q must be a path relative to %s that stays inside the repository", file.Src, img.Dir)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return fieldErr(f, field+".src", "%s does not exist", path.Join(img.Dir, file.Src))
		}
		// A symlink may not lead out of the repository either.
		if real, err := filepath.EvalSymlinks(src); err != nil || !within(mustEval(root), real) {
			return fieldErr(f, field+".src", "%s leads outside the repository", path.Join(img.Dir, file.Src))
		}
		if !strings.HasPrefix(file.Dest, "/") {
			return fieldErr(f, field+".dest", "%q must be an absolute path in the image", file.Dest)
		}
		if file.Mode == "" {
			img.Files[i].Mode = "0644"
		} else if !modeRE.MatchString(file.Mode) {
			return fieldErr(f, field+".mode", "%q is not an octal file mode such as \"0644\"", file.Mode)
		} else if m, _ := strconv.ParseUint(file.Mode, 8, 32); m&0o6000 != 0 {
			return fieldErr(f, field+".mode", "%s sets setuid or setgid; kiln adds neither (a base image's own may be allowed under setuid:)", file.Mode)
		}
		dests := []string{path.Clean(file.Dest)}
		if fi.IsDir() {
			img.Files[i].Dir = true
			dests = nil
			filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					rel, _ := filepath.Rel(src, p)
					dests = append(dests, path.Join(file.Dest, filepath.ToSlash(rel)))
				}
				return nil
			})
		}
		for _, dest := range dests {
			if what, ok := reserved[dest]; ok {
				return fieldErr(f, field+".dest", "%s would overwrite %s", dest, what)
			}
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// validateBases checks bases: one pinned reference for each platform of
// the image, under the platform's canonical name, and no base beside it.
func (img *Image) validateBases(c *Config, f string) error {
	if len(img.Bases) == 0 {
		img.Bases = nil
		return nil
	}
	if img.Base != "" {
		return fieldErr(f, "bases", "set beside base; name one base for all platforms (base) or one per platform (bases), not both")
	}
	platforms := img.Platforms
	if len(platforms) == 0 {
		platforms = c.Platforms
	}
	var want []string
	for _, p := range platforms {
		parsed, _ := ParsePlatform(p) // validated above
		want = append(want, FormatPlatform(parsed))
	}
	bases := map[string]string{}
	for _, key := range sortedKeys(img.Bases) {
		p, err := ParsePlatform(key)
		if err != nil {
			return fieldErr(f, "bases."+key, "%v", err)
		}
		id := FormatPlatform(p)
		if !slices.Contains(want, id) {
			return fieldErr(f, "bases."+key, "%s is not a platform of this image (%s)", id, strings.Join(want, ", "))
		}
		if _, dup := bases[id]; dup {
			return fieldErr(f, "bases."+key, "%s is named twice", id)
		}
		if err := checkBase(img.Bases[key]); err != nil {
			return fieldErr(f, "bases."+key, "%v", err)
		}
		bases[id] = img.Bases[key]
	}
	for _, id := range want {
		if bases[id] == "" {
			return fieldErr(f, "bases", "no base for %s; name one for every platform of the image (%s), or narrow its platforms", id, strings.Join(want, ", "))
		}
	}
	img.Bases = bases
	return nil
}

// HasBase tells whether the image is built on a base rather than scratch.
func (img *Image) HasBase() bool { return img.Base != "" || len(img.Bases) > 0 }

// BaseFor is the base of the image for the platform; "" on scratch.
func (img *Image) BaseFor(p ocispec.Platform) string {
	if img.Base != "" {
		return img.Base
	}
	return img.Bases[FormatPlatform(p)]
}

// AllBases lists the image's bases: the one, or each platform's in the
// order of the platforms' names.
func (img *Image) AllBases() []string {
	if img.Base != "" {
		return []string{img.Base}
	}
	var out []string
	for _, id := range sortedKeys(img.Bases) {
		out = append(out, img.Bases[id])
	}
	return out
}

// checkBase accepts a base image reference pinned by digest.
func checkBase(ref string) error {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return fmt.Errorf("%q is not an image reference: %v", ref, err)
	}
	if _, ok := named.(reference.Digested); !ok {
		return fmt.Errorf("%q is not pinned by digest, so the image would change when the tag moves; run `mage images:pin` to write its digest here (%s@sha256:…)", ref, ref)
	}
	return nil
}
