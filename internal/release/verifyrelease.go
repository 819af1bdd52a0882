package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/sign"
	"github.com/kiln-build/kiln/internal/verify/inspect"
	"github.com/kiln-build/kiln/internal/yamlref"
)

// VerifyReleaseOptions say which release to check and with which key.
type VerifyReleaseOptions struct {
	publish.PushOptions
	// Version is the released version: a git tag of this repository.
	Version string
	// PublicKey is the cosign.pub (or env://VAR) to check signatures with; kiln.yaml's
	// signing.publicKey when empty.
	PublicKey string
	// Assets is a folder holding the release assets with SHA256SUMS and
	// SHA256SUMS.sig, as downloaded; when empty, the release folder
	// `release` wrote (<out>/release/<version>) if there is one.
	Assets string
}

// VerifiedAssets is what release:verify found of the release assets.
type VerifiedAssets struct {
	// Dir is the folder checked; empty when none was given or found.
	Dir string `json:"dir,omitempty"`
	// Verified are the assets whose sha256 SHA256SUMS lists, its signature
	// verified; Compared those rebuilt and found identical.
	Verified []string `json:"verified"`
	Compared []string `json:"compared"`
	Problems []string `json:"problems,omitempty"`
}

// VerifiedImage is one released image as release:verify found it.
type VerifiedImage struct {
	Name string `json:"name"`
	Ref  string `json:"ref"`
	// Digest is the registry's index; Rebuilt the index rebuilt from source,
	// of the Compared platforms (all of them unless -platforms chose some).
	Digest    string   `json:"digest"`
	Rebuilt   string   `json:"rebuilt"`
	Platforms []string `json:"platforms"`
	Compared  []string `json:"compared"`
	// Identical is true when the rebuild equals the registry's index, or,
	// for some platforms only, each of their manifests.
	Identical bool `json:"identical"`
	// Signatures and Attestations are how many verified; Problems say
	// what did not (a missing, tampered or foreign-key signature or
	// attestation, a provenance of another commit).
	Signatures   int      `json:"signatures"`
	Attestations int      `json:"attestations"`
	Problems     []string `json:"problems,omitempty"`
}

// VerifyReleaseOutcome is the result of release:verify; OK only when every
// image is identical to its rebuild and every signature and attestation
// verified.
type VerifyReleaseOutcome struct {
	Version     string               `json:"version"`
	Commit      string               `json:"commit"`
	Images      []VerifiedImage      `json:"images"`
	Assets      VerifiedAssets       `json:"assets"`
	Differences []inspect.Difference `json:"differences"`
	// Rebuild holds the steps of the isolated rebuild.
	Rebuild buildkit.Steps `json:"-"`
}

// OK says every image matched its rebuild.
func (o *VerifyReleaseOutcome) OK() bool {
	for _, img := range o.Images {
		if !img.Identical || len(img.Problems) > 0 {
			return false
		}
	}
	return len(o.Differences) == 0 && len(o.Assets.Problems) == 0
}

// trustCachesInRebuild lets a test that has proven the rebuild's isolation
// once check the rest of release:verify on a warm build.
var trustCachesInRebuild bool

// rebuild builds the images and the assets once as a release builds them
// (session.Options.Release: every step re-run, an empty Go cache of its
// own), the images as OCI tarballs under opts.OutDir, the assets into dir,
// setting each one's SHA256.
func rebuild(ctx context.Context, opts session.Options, assets []image.Asset, dir string) (*session.ImagesOutcome, error) {
	opts.Release, opts.TrustCaches, opts.SkipChecks = true, trustCachesInRebuild, true
	s, err := session.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	// The assets first, as a release writes them: they name the binaries
	// each platform ships before the images ask for any.
	var steps buildkit.Steps
	if len(assets) > 0 {
		var err error
		if steps, err = exportAssets(ctx, s, assets, dir); err != nil {
			return nil, fmt.Errorf("the release assets: %w", err)
		}
	}
	out, err := s.WriteImages(ctx, opts)
	if err != nil {
		return nil, err
	}
	out.Steps = steps.Plus(out.Steps)
	return out, nil
}

// VerifyRelease checks a published release against its source: it checks
// the signatures of every index and platform manifest and the provenance
// and SBOM attestations with the public key, and that the provenance names
// the tag's commit; then it checks out that commit into a temporary
// clone, rebuilds every image for every release platform in isolation
// (as verify:repro does) and compares the indexes, locating any difference
// down to the file and ELF section. opts.Platforms, when set, names the
// release platforms to rebuild and compare, manifest by manifest; the
// signatures and attestations of every platform are checked all the same.
func VerifyRelease(ctx context.Context, opts session.Options, vopts VerifyReleaseOptions) (*VerifyReleaseOutcome, error) {
	if err := plan.ValidVersion(vopts.Version); err != nil {
		return nil, fmt.Errorf("release version: %w", err)
	}
	root := opts.Root
	if root == "" {
		var err error
		if root, err = os.Getwd(); err != nil {
			return nil, err
		}
	}
	commit, err := git(root, "rev-parse", "--verify", "--quiet", "refs/tags/"+vopts.Version+"^{commit}")
	if err != nil {
		return nil, fmt.Errorf("release %s: no such tag in the git repository at %s; fetch the tags (git fetch --tags) or name a released version", vopts.Version, root)
	}
	keyPath := vopts.PublicKey
	if keyPath == "" {
		cfg, err := config.Load(root)
		if err != nil {
			return nil, err
		}
		if keyPath = PublicKeyPath(&plan.Plan{Root: root, Signing: cfg.Signing}); keyPath == "" {
			return nil, fmt.Errorf("no public key: pass -key=cosign.pub or set signing.publicKey in %s", config.File)
		}
	}
	verifier, err := sign.LoadPublicKey(keyPath)
	if err != nil {
		return nil, err
	}
	registry, loopback, err := buildkit.RegistryHost(vopts.Registry)
	if err != nil {
		return nil, err
	}
	resolver := buildkit.Resolver(loopback, vopts.SkipTLSVerify, buildkit.Credentials())

	assetsDir := vopts.Assets
	if assetsDir == "" {
		written := filepath.Join(opts.OutDirFor(root), "release", vopts.Version)
		if _, err := os.Stat(filepath.Join(written, SumsFile)); err == nil {
			assetsDir = written
		}
	} else if fi, err := os.Stat(assetsDir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("-assets=%s: no such folder; download the release assets with SHA256SUMS and SHA256SUMS.sig into one", assetsDir)
	}

	tmp, err := os.MkdirTemp("", "kiln-release-verify-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// A clone, not a worktree: nothing is written into the user's .git (an
	// interrupted run leaves only the temporary folder), and none of their
	// hooks runs. It carries the tags, so git describe stamps the same.
	src := filepath.Join(tmp, "src")
	if _, err := git(root, "-c", "core.hooksPath=/dev/null", "clone", "--quiet", "--shared", "--no-checkout", root, src); err != nil {
		return nil, fmt.Errorf("check out %s (%s): %w", vopts.Version, commit, err)
	}
	if _, err := git(src, "-c", "core.hooksPath=/dev/null", "checkout", "--quiet", "--detach", commit); err != nil {
		return nil, fmt.Errorf("check out %s (%s): %w", vopts.Version, commit, err)
	}

	opts.Root, opts.OutDir = src, filepath.Join(tmp, "out")
	opts.Stamp, opts.Release, opts.TrustCaches = true, true, false
	// The tag's own kiln.yaml says what its release carried.
	cfg, err := opts.Config()
	if err != nil {
		return nil, fmt.Errorf("the checkout of %s: %w", vopts.Version, err)
	}
	released := cfg.Release.Platforms
	partial, err := releasePlatforms(opts.Platforms, released)
	if err != nil {
		return nil, err
	}
	if !partial {
		opts.Platforms = strings.Join(released, ",")
	}
	p, err := session.Plan(opts)
	if err != nil {
		return nil, fmt.Errorf("the plan of %s: %w", vopts.Version, err)
	}
	if p.Stamp.Version != vopts.Version || p.Stamp.Commit != commit {
		return nil, fmt.Errorf("the checkout of %s stamps version %s, commit %s; a release of that tag stamps %s, %s", vopts.Version, p.Stamp.Version, p.Stamp.Commit, vopts.Version, commit)
	}

	out := &VerifyReleaseOutcome{Version: vopts.Version, Commit: commit, Assets: VerifiedAssets{Dir: assetsDir}}
	var assets []image.Asset
	var sums map[string]string
	var rebuilding []string
	if chosen, err := config.ParsePlatforms(opts.Platforms); err == nil {
		for _, c := range chosen {
			rebuilding = append(rebuilding, config.FormatPlatform(c))
		}
	}
	if assetsDir != "" {
		var problems []string
		var names []string
		for _, a := range image.Assets(cfg.Release) {
			names = append(names, a.Name)
		}
		for _, m := range cfg.Release.ManifestFiles {
			names = append(names, m.Name)
		}
		sums, problems = checkAssets(assetsDir, names, verifier)
		out.Assets.Problems = problems
		for _, name := range names {
			if _, ok := sums[name]; ok {
				out.Assets.Verified = append(out.Assets.Verified, name)
			}
		}
		for _, a := range image.Assets(cfg.Release) {
			// Those of the platforms rebuilt, or all of them.
			if !partial || slices.Contains(rebuilding, a.Platform) {
				assets = append(assets, a)
			}
		}
		var platforms []string
		for _, a := range assets {
			if !slices.Contains(platforms, a.Platform) {
				platforms = append(platforms, a.Platform)
			}
		}
		opts.BinaryPlatforms = strings.Join(platforms, ",")
	}
	for _, img := range p.Images {
		vi, err := checkPublished(ctx, resolver, verifier, registry, p, img, commit)
		if err != nil {
			return nil, err
		}
		out.Images = append(out.Images, *vi)
	}
	if assetsDir != "" {
		compared, problems := checkManifests(src, cfg.Release.ManifestFiles, p.Repository, out.Images, sums)
		out.Assets.Compared = append(out.Assets.Compared, compared...)
		out.Assets.Problems = append(out.Assets.Problems, problems...)
	}

	rebuilt, err := rebuild(ctx, opts, assets, filepath.Join(tmp, "assets"))
	if err != nil {
		return nil, fmt.Errorf("rebuild %s in isolation: %w", vopts.Version, err)
	}
	out.Rebuild = rebuilt.Steps
	for _, a := range assets {
		switch listed, ok := sums[a.Name]; {
		case !ok:
		case listed != a.SHA256:
			out.Assets.Problems = append(out.Assets.Problems, fmt.Sprintf("%s: SHA256SUMS says %s, the rebuild from source is %s", a.Name, listed, a.SHA256))
		default:
			out.Assets.Compared = append(out.Assets.Compared, a.Name)
		}
	}
	for i, r := range rebuilt.Images {
		vi := &out.Images[i]
		vi.Rebuilt, vi.Compared = r.Digest, r.Platforms
		if !partial && r.Digest == vi.Digest {
			vi.Identical = true
			continue
		}
		published, err := PullLayout(ctx, resolver, vi.Ref, digest.Digest(vi.Digest))
		if err != nil {
			return nil, err
		}
		local, err := inspect.ReadLayout(r.Path)
		if err != nil {
			return nil, err
		}
		diffs := inspect.DiffLayouts(r.Name, published, local)
		if partial {
			diffs = inspect.DiffPlatforms(r.Name, published, local, r.Platforms)
		}
		vi.Identical = len(diffs) == 0
		out.Differences = append(out.Differences, diffs...)
	}
	return out, nil
}

// checkAssets checks the release assets in dir: SHA256SUMS's signature
// (SHA256SUMS.sig, as cosign verify-blob reads it), that it lists exactly
// the assets the tag's kiln.yaml names, and each file's sha256. sums are
// the sha256 of each asset that matched, by name.
func checkAssets(dir string, names []string, verifier *sign.Verifier) (sums map[string]string, problems []string) {
	problem := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if len(names) == 0 {
		problem("%s: the tag's %s names no release assets", dir, config.File)
		return nil, problems
	}
	list, err := os.ReadFile(filepath.Join(dir, SumsFile))
	if err != nil {
		problem("%s: %v", dir, err)
		return nil, problems
	}
	sig, err := os.ReadFile(filepath.Join(dir, SumsFile+".sig"))
	if err != nil {
		problem("%s: %v", dir, err)
		return nil, problems
	}
	if err := verifier.Verify(list, strings.TrimSpace(string(sig))); err != nil {
		problem("%s: the signature %s does not verify: %v", filepath.Join(dir, SumsFile), SumsFile+".sig", err)
		return nil, problems
	}
	listed := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(string(list), "\n"), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok || len(sum) != 64 {
			problem("%s: %q is not a line of sha256sum", filepath.Join(dir, SumsFile), line)
			continue
		}
		listed[name] = sum
	}
	sums = map[string]string{}
	for _, name := range names {
		sum, ok := listed[name]
		if !ok {
			problem("%s lists no %s, which the release carries", SumsFile, name)
			continue
		}
		delete(listed, name)
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			problem("%s: %v", name, err)
			continue
		}
		if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != sum {
			problem("%s: its sha256 is %x, SHA256SUMS says %s", name, h, sum)
			continue
		}
		sums[name] = sum
	}
	for _, name := range slices.Sorted(maps.Keys(listed)) {
		problem("%s lists %s, which the tag's %s does not name", SumsFile, name, config.File)
	}
	return sums, problems
}

// checkManifests pins the tag's release.manifests (under root) to the
// images as the registry serves them and compares each with the sha256
// SHA256SUMS lists for it (sums): a manifest that pins other digests, or
// is not the tag's, is a problem.
func checkManifests(root string, files []config.ManifestFile, repository string, images []VerifiedImage, sums map[string]string) (compared, problems []string) {
	if len(files) == 0 {
		return nil, nil
	}
	manifests, err := publish.ReadManifests(root, files)
	if err != nil {
		return nil, []string{err.Error()}
	}
	published := map[string]yamlref.Pushed{}
	for _, img := range images {
		i := strings.LastIndex(img.Ref, ":")
		published[repository+"/"+img.Name] = yamlref.Pushed{Name: img.Ref[:i], Tag: img.Ref[i+1:], Digest: img.Digest}
	}
	pinned, _, err := publish.Pin(manifests, published, "release.manifests", "")
	if err != nil {
		return nil, []string{err.Error()}
	}
	for i, m := range manifests {
		listed, ok := sums[m.Rel]
		if !ok {
			continue // checkAssets said why
		}
		h := sha256.Sum256(pinned[i])
		if got := hex.EncodeToString(h[:]); got != listed {
			problems = append(problems, fmt.Sprintf("%s: SHA256SUMS says %s; the tag's %s pinned to the images the registry serves is %s", m.Rel, listed, m.Path, got))
			continue
		}
		compared = append(compared, m.Rel)
	}
	return compared, problems
}

// releasePlatforms checks a -platforms list against the release's and
// says whether it names fewer.
func releasePlatforms(list string, released []string) (bool, error) {
	if list == "" {
		return false, nil
	}
	chosen, err := config.ParsePlatforms(list)
	if err != nil {
		return false, fmt.Errorf("-platforms: %w", err)
	}
	for _, p := range chosen {
		if !slices.Contains(released, config.FormatPlatform(p)) {
			return false, fmt.Errorf("-platforms: %s is not a release platform; the release carries %s (release.platforms in %s)", config.FormatPlatform(p), strings.Join(released, ","), config.File)
		}
	}
	return len(chosen) < len(released), nil
}

// checkPublished resolves an image of the release and verifies its
// signatures and attestations; what fails to verify is a problem of the
// image, so the rebuild still runs and locates any difference.
func checkPublished(ctx context.Context, resolver remotes.Resolver, verifier *sign.Verifier, registry string, p *plan.Plan, img plan.Image, commit string) (*VerifiedImage, error) {
	repo := registry + "/" + p.Repository + "/" + img.Name
	ref := repo + ":" + p.Stamp.Version
	_, desc, err := resolver.Resolve(ctx, ref)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("%s does not exist: was %s released to %s?", ref, p.Stamp.Version, registry)
	}
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", ref, err)
	}
	vi := &VerifiedImage{Name: img.Name, Ref: ref, Digest: desc.Digest.String()}
	problem := func(err error) { vi.Problems = append(vi.Problems, err.Error()) }
	if err := verifier.VerifyImage(ctx, resolver, repo, desc.Digest); err != nil {
		problem(err)
	} else {
		vi.Signatures++
	}
	_, manifests, err := publish.PlatformManifests(ctx, resolver, repo, desc.Digest)
	if err != nil {
		return nil, err
	}
	for _, m := range manifests {
		platform := config.FormatPlatform(*m.Platform)
		vi.Platforms = append(vi.Platforms, platform)
		if err := verifier.VerifyImage(ctx, resolver, repo, m.Digest); err != nil {
			problem(fmt.Errorf("%s: %w", platform, err))
		} else {
			vi.Signatures++
		}
		// Each platform manifest carries the provenance and its own SBOM.
		statements, err := verifier.VerifyAttestations(ctx, resolver, repo, m.Digest)
		if err != nil {
			problem(fmt.Errorf("%s: %w", platform, err))
			continue
		}
		for _, err := range checkStatements(statements, []digest.Digest{m.Digest}, commit, p.Stamp.Version) {
			problem(fmt.Errorf("%s: %w", platform, err))
		}
	}
	statements, err := verifier.VerifyAttestations(ctx, resolver, repo, desc.Digest)
	if err != nil {
		problem(err)
		return vi, nil
	}
	var platformDigests []digest.Digest
	for _, m := range manifests {
		platformDigests = append(platformDigests, m.Digest)
	}
	for _, err := range checkStatements(statements, platformDigests, commit, p.Stamp.Version) {
		problem(err)
	}
	vi.Attestations = len(statements)
	return vi, nil
}

// checkStatements checks verified statements: one provenance of a clean
// tree at commit, and one SBOM for each platform manifest.
func checkStatements(statements []sign.Statement, platforms []digest.Digest, commit, version string) []error {
	var errs []error
	var provenance int
	sbomOf := map[digest.Digest]int{}
	for _, st := range statements {
		switch st.PredicateType {
		case ProvenancePredicateType:
			provenance++
			var pred struct {
				BuildDefinition struct {
					ExternalParameters struct {
						Source struct{ Commit, TreeState string } `json:"source"`
					} `json:"externalParameters"`
				} `json:"buildDefinition"`
			}
			if err := json.Unmarshal(st.Predicate, &pred); err != nil {
				errs = append(errs, fmt.Errorf("the provenance is not SLSA v1: %w", err))
				continue
			}
			src := pred.BuildDefinition.ExternalParameters.Source
			if src.Commit != commit || src.TreeState != "clean" {
				errs = append(errs, fmt.Errorf("the provenance names commit %q, tree %q; the tag %s is %s, clean", src.Commit, src.TreeState, version, commit))
			}
		case image.SPDXPredicateType:
			for _, s := range st.Subject {
				for _, d := range platforms {
					if s.Digest[d.Algorithm().String()] == d.Encoded() {
						sbomOf[d]++
					}
				}
			}
		}
	}
	if provenance != 1 {
		errs = append(errs, fmt.Errorf("%d provenance attestations verified; want 1", provenance))
	}
	for _, d := range platforms {
		if sbomOf[d] != 1 {
			errs = append(errs, fmt.Errorf("%d SBOM attestations of platform manifest %s verified; want 1", sbomOf[d], d))
		}
	}
	return errs
}

// Bounds of an image PullLayout reads.
const (
	maxPulledImage = 4 << 30
	maxPulledBlobs = 4096
)

// PullLayout reads an image index and everything it names from a registry
// into an in-memory OCI layout.
func PullLayout(ctx context.Context, resolver remotes.Resolver, ref string, index digest.Digest) (*inspect.Layout, error) {
	repo := sign.Repository(ref)
	_, desc, err := resolver.Resolve(ctx, repo+"@"+index.String())
	if err != nil {
		return nil, fmt.Errorf("resolve %s@%s: %w", repo, index, err)
	}
	f, err := resolver.Fetcher(ctx, repo+"@"+index.String())
	if err != nil {
		return nil, err
	}
	blobs := map[string][]byte{}
	var total int64
	var fetch func(d ocispec.Descriptor) error
	fetch = func(d ocispec.Descriptor) error {
		key := "blobs/" + d.Digest.Algorithm().String() + "/" + d.Digest.Encoded()
		if _, ok := blobs[key]; ok {
			return nil
		}
		// The registry is the party under test: what it names is read only
		// within bounds.
		if total += d.Size; d.Size < 0 || total > maxPulledImage || len(blobs) >= maxPulledBlobs {
			return fmt.Errorf("pull %s: the image is larger than kiln compares (%d bytes or %d blobs at most)", repo, int64(maxPulledImage), maxPulledBlobs)
		}
		data, err := buildkit.ReadBlob(ctx, f, d, maxPulledImage)
		if err != nil {
			return fmt.Errorf("pull %s %s: %w", repo, d.Digest, err)
		}
		blobs[key] = data
		switch d.MediaType {
		case ocispec.MediaTypeImageIndex, "application/vnd.docker.distribution.manifest.list.v2+json":
			var idx ocispec.Index
			if err := json.Unmarshal(data, &idx); err != nil {
				return err
			}
			for _, m := range idx.Manifests {
				if err := fetch(m); err != nil {
					return err
				}
			}
		case ocispec.MediaTypeImageManifest, "application/vnd.docker.distribution.manifest.v2+json":
			var m ocispec.Manifest
			if err := json.Unmarshal(data, &m); err != nil {
				return err
			}
			for _, d := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
				if err := fetch(d); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := fetch(desc); err != nil {
		return nil, err
	}
	top, _ := json.Marshal(ocispec.Index{Manifests: []ocispec.Descriptor{desc}})
	blobs["index.json"] = top
	return inspect.LayoutFromBlobs(ref, blobs)
}

func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
			return "", fmt.Errorf("git %s: %s", strings.Join(args, " "), strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}
