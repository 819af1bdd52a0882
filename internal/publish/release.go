package publish

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
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/sign"
)

// ReleaseOptions control `mage release`.
type ReleaseOptions struct {
	PushOptions
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
	Caches    string       `json:"caches"`
	Images    []PushResult `json:"images"`
	Platforms []string     `json:"platforms"`
	// AssetsDir is empty when release.assets names none.
	AssetsDir string        `json:"assetsDir,omitempty"`
	Assets    []image.Asset `json:"assets"`
}

// Release stamps the build (version, commit, tree state), writes the
// release assets with SHA256SUMS and its signature under
// <out>/release/<version>/, pushes every image for every release platform,
// and signs each index and platform manifest and attaches a signed SLSA v1
// provenance and SPDX SBOMs, as cosign stores them. The indexes hold only
// the images, so a rebuild of the same commit has the same digests.
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
	if len(p.Untracked) > 0 && !ropts.Force {
		return nil, fmt.Errorf("git tracks none of %s, which the release reads: commit them or remove them, or pass -force to release it stamped %q", strings.Join(p.Untracked, ", "), "dirty")
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
	if len(assets) > 0 {
		sum.AssetsDir = filepath.Join(opts.OutDirFor(p.Root), "release", p.Stamp.Version)
	}
	tags := []string{p.Stamp.Version}
	if ropts.Latest {
		tags = append(tags, "latest")
	}
	for _, img := range p.Images {
		r := PushResult{Name: img.Name}
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
	s, err := prepared.Start(ctx)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if sum.AssetsDir != "" {
		if err := writeAssets(ctx, s, sum, signer); err != nil {
			return nil, err
		}
	}
	// Read back: signing reads the registry with kiln's client anyway.
	pushed, err := push(ctx, s, registry, ropts.SkipTLSVerify, ropts.Latest, true)
	if err != nil {
		return nil, err
	}
	sum.Images = pushed
	_, loopback, _ := buildkit.RegistryHost(registry)
	resolver := buildkit.Resolver(loopback, ropts.SkipTLSVerify, buildkit.Credentials())
	if err := attestRelease(ctx, s, signer, resolver, registry, caches, pushed); err != nil {
		return nil, fmt.Errorf("sign the release in %s: %w", registry, err)
	}
	return sum, nil
}

// writeAssets cross-compiles the release binaries and writes them with a
// SHA256SUMS file and its signature (SHA256SUMS.sig, for cosign
// verify-blob); the directory appears whole or not at all.
func writeAssets(ctx context.Context, s *session.Session, sum *ReleaseSummary, signer *sign.Signer) error {
	work := sum.AssetsDir + ".work"
	sums, _, err := exportAssets(ctx, s, sum.Assets, work)
	if err != nil {
		return err
	}
	sig, err := signer.Sign(sums)
	if err != nil {
		os.RemoveAll(work)
		return err
	}
	if err := os.WriteFile(filepath.Join(work, SumsFile), sums, 0o644); err != nil {
		os.RemoveAll(work)
		return err
	}
	if err := os.WriteFile(filepath.Join(work, SumsFile+".sig"), []byte(sig+"\n"), 0o644); err != nil {
		os.RemoveAll(work)
		return err
	}
	if err := atomicfile.Replace(work, sum.AssetsDir); err != nil {
		os.RemoveAll(work)
		return err
	}
	return nil
}

// SumsFile lists the sha256 of every release asset, as sha256sum prints
// them; SumsFile.sig is its signature.
const SumsFile = "SHA256SUMS"

// exportAssets cross-compiles the assets into work, sets each one's SHA256
// and returns the SHA256SUMS file of them and the steps of the solve; on
// error work is removed.
func exportAssets(ctx context.Context, s *session.Session, assets []image.Asset, work string) ([]byte, buildkit.Steps, error) {
	var files []export.FileCopy
	var targets []ocispec.Platform
	for _, a := range assets {
		target, err := config.ParsePlatform(a.Platform)
		if err != nil {
			return nil, nil, err
		}
		s.Ships(target, a.Binary)
		targets = append(targets, target)
	}
	for i, a := range assets {
		files = append(files, export.FileCopy{From: s.Binary(a.Binary, targets[i]), Src: "/" + a.Binary, Dest: "/" + a.Name})
	}
	os.RemoveAll(work)
	steps, _, err := s.ExportFiles(ctx, "release assets", files, work, nil)
	if err != nil {
		os.RemoveAll(work)
		return nil, nil, err
	}
	var lines []string
	for i, a := range assets {
		data, err := os.ReadFile(filepath.Join(work, a.Name))
		if err != nil {
			os.RemoveAll(work)
			return nil, nil, err
		}
		h := sha256.Sum256(data)
		assets[i].SHA256 = hex.EncodeToString(h[:])
		lines = append(lines, fmt.Sprintf("%s  %s", assets[i].SHA256, a.Name))
	}
	sort.Strings(lines)
	return []byte(strings.Join(lines, "\n") + "\n"), steps, nil
}
