package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/buildkit/export"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/sign"
	"github.com/kiln-build/kiln/internal/spread"
	"github.com/kiln-build/kiln/internal/yamlref"
)

// ReleaseOptions control `mage release`.
type ReleaseOptions struct {
	publish.PushOptions
	// DryRun resolves and prints what would be published, building nothing.
	DryRun bool
	// Force releases a tree with uncommitted changes (stamped dirty).
	Force bool
	// TrustCaches lets the release import the configured layer cache and
	// seed from the Go cache snapshots, on the shared Go cache mount; the
	// summary and the provenance record it.
	TrustCaches bool
}

// ReleaseSummary is what a release published, or would publish.
type ReleaseSummary struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	TreeState string `json:"treeState"`
	DryRun    bool   `json:"dryRun"`
	// Caches is "isolated" (no shared cache read or written) or "trusted".
	Caches    string          `json:"caches"`
	Images    []ReleasedImage `json:"images"`
	Platforms []string        `json:"platforms"`
	// AssetsDir is empty when release.assets and release.manifests name
	// none.
	AssetsDir string             `json:"assetsDir,omitempty"`
	Assets    []image.Asset      `json:"assets"`
	Manifests []ReleasedManifest `json:"manifests,omitempty"`
}

// ReleasedManifest is a YAML file of release.manifests as a release
// asset: Name in the assets folder, from Source in the repository.
type ReleasedManifest struct {
	Name       string `json:"name"`
	Source     string `json:"source"`
	References int    `json:"references"`
	SHA256     string `json:"sha256,omitempty"`
}

// Release stamps the build (version, commit, tree state), pushes every
// image for every release platform, signs each index and platform
// manifest and attaches a signed SLSA v1 provenance and SPDX SBOMs, as
// cosign stores them, then writes the release assets (binaries, and the
// manifests pinned to the digests pushed) with SHA256SUMS and its
// signature under <out>/release/<version>/. The indexes hold only the
// images, so a rebuild of the same commit has the same digests.
func Release(ctx context.Context, opts session.Options, ropts ReleaseOptions) (*ReleaseSummary, error) {
	cfg, err := opts.Config()
	if err != nil {
		return nil, err
	}
	assets := image.Assets(cfg.Release)
	opts.Stamp = true
	opts.Platforms = strings.Join(cfg.Release.Platforms, ",")
	opts.Release, opts.TrustCaches = true, ropts.TrustCaches
	var assetPlatforms []string
	for _, a := range assets {
		if !slices.Contains(assetPlatforms, a.Platform) {
			assetPlatforms = append(assetPlatforms, a.Platform)
		}
	}
	// The assets' platforms are compiled too: their modules must be
	// downloaded (cobra needs mousetrap on windows only).
	opts.BinaryPlatforms = strings.Join(assetPlatforms, ",")
	caches := "isolated"
	if ropts.TrustCaches {
		caches = "trusted"
	}
	// One load and one plan, checked before any daemon is contacted; Start
	// resolves again only for a worker of another platform.
	prepared, err := session.Prepare(ctx, opts)
	if err != nil {
		return nil, err
	}
	p, err := prepared.Plan()
	if err != nil {
		return nil, err
	}
	manifests, err := publish.ReadManifests(p.Root, p.Release.ManifestFiles)
	if err != nil {
		return nil, err
	}
	var manifestPaths []string
	for _, m := range p.Release.ManifestFiles {
		manifestPaths = append(manifestPaths, m.Path)
	}
	if untracked := slices.Concat(p.Untracked, p.UntrackedOf(manifestPaths)); len(untracked) > 0 && !ropts.Force {
		return nil, fmt.Errorf("git tracks none of %s, which the release reads: commit them or remove them, or pass -force to release it stamped %q", strings.Join(untracked, ", "), "dirty")
	}
	if p.Stamp.TreeState == "dirty" && !ropts.Force {
		return nil, fmt.Errorf("the tree has uncommitted changes: commit them, or pass -force to release it stamped %q", "dirty")
	}
	registry, _, err := buildkit.RegistryHost(ropts.Registry)
	if err != nil {
		return nil, err
	}
	sum := &ReleaseSummary{Version: p.Stamp.Version, Commit: p.Stamp.Commit, TreeState: p.Stamp.TreeState, DryRun: ropts.DryRun, Caches: caches,
		Platforms: p.PlatformIDs(), Assets: assets}
	if len(manifests) > 0 {
		var names []string
		for _, img := range p.Images {
			names = append(names, img.Name)
		}
		if err := publish.CheckPinnable(p.Repository, names, manifests, "release.manifests", strings.Join(p.Release.Manifests, ", ")); err != nil {
			return nil, err
		}
		for _, m := range p.Release.ManifestFiles {
			sum.Manifests = append(sum.Manifests, ReleasedManifest{Name: m.Name, Source: m.Path})
		}
	}
	if len(assets) > 0 || len(manifests) > 0 {
		sum.AssetsDir = filepath.Join(opts.OutDirFor(p.Root), "release", p.Stamp.Version)
	}
	tags := []string{p.Stamp.Version}
	if ropts.Latest {
		tags = append(tags, "latest")
	}
	for _, img := range p.Images {
		r := ReleasedImage{PushResult: publish.PushResult{Name: img.Name}}
		for _, tag := range tags {
			r.Refs = append(r.Refs, fmt.Sprintf("%s/%s/%s:%s", registry, p.Repository, img.Name, tag))
		}
		sum.Images = append(sum.Images, r)
	}
	if ropts.DryRun {
		return sum, nil
	}

	signer, err := loadSigner(p)
	if err != nil {
		return nil, err
	}
	// The binaries are compiled first, so a release that cannot build one
	// pushes nothing (spread, the other daemons may have pushed their
	// platforms by digest; no tag moves); the folder appears once the
	// release is signed.
	work := ""
	if sum.AssetsDir != "" {
		work = sum.AssetsDir + ".work"
		defer os.RemoveAll(work)
	}
	var b *built
	if hosts := spread.Daemons(opts); len(hosts) > 1 {
		b, err = buildSpread(ctx, opts, ropts, p, sum.Assets, work, registry, hosts)
	} else {
		b, err = buildOnDaemon(ctx, prepared, opts, ropts, sum.Assets, work, registry)
	}
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(b.tmp)
	sum.Images = nil
	for _, r := range b.pushed {
		sum.Images = append(sum.Images, ReleasedImage{PushResult: r})
	}
	_, loopback, _ := buildkit.RegistryHost(registry)
	resolver := buildkit.Resolver(loopback, ropts.SkipTLSVerify, buildkit.Credentials())
	if err := attestRelease(ctx, b, signer, resolver, registry, caches, sum.Images); err != nil {
		return nil, fmt.Errorf("sign the release in %s: %w", registry, err)
	}
	if sum.AssetsDir != "" {
		if err := finishAssets(work, sum, manifests, publish.PushedImages(p.Repository, b.pushed), signer); err != nil {
			return nil, err
		}
	}
	return sum, nil
}

// finishAssets writes the manifests pinned to the images pushed beside
// the binaries in work, then SHA256SUMS of them all and its signature
// (SHA256SUMS.sig, for cosign verify-blob), and puts work in place: the
// folder appears whole or not at all.
func finishAssets(work string, sum *ReleaseSummary, manifests []publish.ManifestFile, images map[string]yamlref.Pushed, signer *sign.Signer) error {
	shas := map[string]string{}
	for _, a := range sum.Assets {
		shas[a.Name] = a.SHA256
	}
	if len(manifests) > 0 {
		pinned, counts, err := publish.Pin(manifests, images, "release.manifests", "")
		if err != nil {
			return err
		}
		for i, m := range manifests {
			if err := os.WriteFile(filepath.Join(work, m.Rel), pinned[i], 0o644); err != nil {
				return err
			}
			h := sha256.Sum256(pinned[i])
			sum.Manifests[i].References, sum.Manifests[i].SHA256 = counts[i], hex.EncodeToString(h[:])
			shas[m.Rel] = sum.Manifests[i].SHA256
		}
	}
	sums := sumsFile(shas)
	sig, err := signer.Sign(sums)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, SumsFile), sums, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, SumsFile+".sig"), []byte(sig+"\n"), 0o644); err != nil {
		return err
	}
	return atomicfile.Replace(work, sum.AssetsDir)
}

// sumsFile is SHA256SUMS of the files, as sha256sum prints them, sorted.
func sumsFile(shas map[string]string) []byte {
	var lines []string
	for name, sha := range shas {
		lines = append(lines, fmt.Sprintf("%s  %s", sha, name))
	}
	sort.Strings(lines)
	return []byte(strings.Join(lines, "\n") + "\n")
}

// SumsFile lists the sha256 of every release asset, as sha256sum prints
// them; SumsFile.sig is its signature.
const SumsFile = "SHA256SUMS"

// exportAssets cross-compiles the assets into work, a new folder, sets
// each one's SHA256 and returns the steps of the solve; on error work is
// removed.
func exportAssets(ctx context.Context, s *session.Session, assets []image.Asset, work string) (buildkit.Steps, error) {
	os.RemoveAll(work)
	if len(assets) == 0 {
		return nil, os.MkdirAll(work, 0o755)
	}
	var files []export.FileCopy
	var targets []ocispec.Platform
	for _, a := range assets {
		target, err := config.ParsePlatform(a.Platform)
		if err != nil {
			return nil, err
		}
		s.Ships(target, a.Binary)
		targets = append(targets, target)
	}
	for i, a := range assets {
		files = append(files, export.FileCopy{From: s.Binary(a.Binary, targets[i]), Src: "/" + a.Binary, Dest: "/" + a.Name})
	}
	steps, _, err := s.ExportFiles(ctx, "release assets", files, work, nil)
	if err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	for i, a := range assets {
		data, err := os.ReadFile(filepath.Join(work, a.Name))
		if err != nil {
			os.RemoveAll(work)
			return nil, err
		}
		h := sha256.Sum256(data)
		assets[i].SHA256 = hex.EncodeToString(h[:])
	}
	return steps, nil
}
