// Package namespaces is kiln's namespaced mage targets: images:load,
// images:pin, images:smoke, images:push, images:resolve, verify:repro,
// release:verify, bench:compare and buildkit:*.
// They live apart from package targets because mage names a namespace after
// its type, and a type Images cannot sit beside the images target in one
// package; import both (see package targets).
package namespaces

//mage:multiline

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/magefile/mage/mg"

	"github.com/kiln-build/kiln/internal/bench"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/cli"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/release"
	"github.com/kiln-build/kiln/internal/verify"
)

// Images loads, pins, smoke-runs, pushes and resolves the images.
type Images mg.Namespace

// Streams every image into containerd: all platforms, index digest intact.
//
// Named <repository>/<image>:<tag>.
//
//	-address=SOCKET       containerd's socket (or CONTAINERD_ADDRESS)
//	-namespace=NAME       containerd namespace (default k8s.io)
//	-platforms, -stamp, -progress as for images
func (Images) Load(ctx context.Context, address *string, namespace *string, platforms *string, stamp *bool, progress *string) error {
	results, err := publish.Load(ctx, cli.Options(platforms, stamp, progress), cli.LoadOptions(address, namespace))
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	for _, r := range results {
		fmt.Printf("%s\t%s\n", r.Ref, r.Digest)
	}
	return nil
}

// Runs every binary of every loaded image with --version under containerd.
//
// On each platform (arm64 and arm through qemu binfmt when registered; the
// others are reported as skipped, with why), checking version, commit,
// platform and cgo off.
//
//	-address, -namespace   as for images:load
//	-platforms, -stamp     as for images
func (Images) Smoke(ctx context.Context, address *string, namespace *string, platforms *string, stamp *bool) error {
	results, err := publish.Smoke(ctx, cli.Options(platforms, stamp, nil), cli.LoadOptions(address, namespace))
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	failed := 0
	for _, r := range results {
		switch {
		case r.Skipped != "":
			fmt.Printf("skip\t%s %s %s: %s\n", r.Image, r.Platform, r.Binary, r.Skipped)
		case r.Err != "":
			failed++
			fmt.Printf("FAIL\t%s %s %s: %s\n", r.Image, r.Platform, r.Binary, r.Err)
		default:
			fmt.Printf("ok\t%s %s %s: %s\n", r.Image, r.Platform, r.Binary, r.Output)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d smoke runs failed", failed, len(results))
	}
	return nil
}

// Pushes every image, all platforms in one index, to a registry.
//
// As <registry>/<repository>/<image>:<version>; credentials come from the
// Docker config (DOCKER_CONFIG).
//
//	-registry=HOST[:PORT]   (or REGISTRY)
//	-latest                 also tag latest
//	-skiptlsverify          let BuildKit use plain HTTP and skip certificate
//	                        checks for this registry (registry.insecure); a
//	                        loopback registry needs no flag
//	-platforms, -stamp, -progress, -cacheto, -cachefrom, -metadata as for images
//
// BUILDKIT_HOST=A,B,... spreads the platforms over several daemons: each
// pushes its platforms by digest, then kiln tags each image's index.
//
//	-retryelsewhere         with several daemons, push the platforms of one
//	                        that fails from one that finished
func (Images) Push(ctx context.Context, registry *string, latest *bool, skiptlsverify *bool, platforms *string, stamp *bool, progress *string, cacheto *string, cachefrom *string, metadata *string, retryelsewhere *bool) error {
	o := cli.Options(platforms, stamp, progress)
	o.CacheTo, o.CacheFrom = cli.Str(cacheto), cli.Str(cachefrom)
	results, err := publish.Push(ctx, o, publish.PushOptions{Registry: cli.Str(registry), Latest: cli.Bool(latest), SkipTLSVerify: cli.Bool(skiptlsverify), ReadBack: cli.Str(metadata) != "", RetryElsewhere: cli.Bool(retryelsewhere)})
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	for _, r := range results {
		fmt.Printf("%s\t%s\n", strings.Join(r.Refs, ","), r.Digest)
	}
	return cli.WriteMetadata(cli.Str(metadata), map[string]any{"images": results})
}

// Pushes every image and pins the manifests that name them to its digest.
//
// As ko resolve: every YAML file under -f (Kubernetes manifests, Helm values)
// is written to -o with each reference to one of the repository's images
// (REPO/IMAGE, any registry, tag or digest) replaced by the pushed
// <registry>/<repository>/<image>@sha256:…; Helm values' repository and tag
// (or digest) are pinned together. Every other byte stays as it was.
//
//	-f=DIR_OR_FILE          the manifests (.yaml, .yml)
//	-o=DIR                  where the pinned files go (default _output/resolved)
//	-registry, -latest, -skiptlsverify, -platforms, -stamp, -progress,
//	-cacheto, -cachefrom    as for images:push
//	-metadata=FILE          write the pushed images and written files as JSON
//
// BUILDKIT_HOST=A,B,... spreads the platforms over several daemons, as
// images:push does, -retryelsewhere too.
func (Images) Resolve(ctx context.Context, f *string, o *string, registry *string, latest *bool, skiptlsverify *bool, platforms *string, stamp *bool, progress *string, cacheto *string, cachefrom *string, metadata *string, retryelsewhere *bool) error {
	opts := cli.Options(platforms, stamp, progress)
	opts.CacheTo, opts.CacheFrom = cli.Str(cacheto), cli.Str(cachefrom)
	popts := publish.PushOptions{Registry: cli.Str(registry), Latest: cli.Bool(latest), SkipTLSVerify: cli.Bool(skiptlsverify), ReadBack: cli.Str(metadata) != "", RetryElsewhere: cli.Bool(retryelsewhere)}
	out, err := publish.Resolve(ctx, opts, popts, publish.ResolveOptions{From: cli.Str(f), Out: cli.Str(o)})
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	for _, r := range out.Images {
		fmt.Printf("%s\t%s\n", strings.Join(r.Refs, ","), r.Digest)
	}
	for _, file := range out.Files {
		fmt.Printf("%s\t%d reference(s) pinned\n", file.Path, file.References)
	}
	return cli.WriteMetadata(cli.Str(metadata), out)
}

// Pins every image's base to the digest its tag names now.
//
// Writes REGISTRY/NAME:TAG@sha256:… into each image.yaml for base: and each
// bases: entry that has no digest yet; credentials come from the Docker
// config (DOCKER_CONFIG).
func (Images) Pin(ctx context.Context) error {
	cli.Logging()
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	pinned, err := image.PinBases(ctx, root)
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	if len(pinned) == 0 {
		fmt.Println("every base is pinned by digest already")
	}
	for _, p := range pinned {
		fmt.Printf("%s\t%s %s\n\t-> %s\n", p.File, p.Field, p.From, p.To)
	}
	return nil
}

// Verify holds the checks that rebuild.
type Verify mg.Namespace

// Builds every image twice, the second time in isolation, and compares them.
//
// The second build reuses nothing built before it: every step runs again,
// once for all images, on an empty Go cache. Every index, manifest, config,
// layer, file and ELF section is compared and each difference is located.
//
//	-platforms, -progress   as for images
func (Verify) Repro(ctx context.Context, platforms *string, progress *string) error {
	out, err := verify.Repro(ctx, cli.Options(platforms, nil, progress))
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	for i, img := range out.First {
		same := "identical"
		if img.Digest != out.Second[i].Digest {
			same = "DIFFERENT: " + out.Second[i].Digest
		}
		fmt.Printf("%s\t%s\t%s\n", img.Ref, img.Digest, same)
	}
	if len(out.Differences) == 0 {
		return nil
	}
	fmt.Println("\nwhere the builds differ:")
	for _, d := range out.Differences {
		fmt.Println("  " + d.String())
	}
	return fmt.Errorf("the two builds of this commit differ in %d places", len(out.Differences))
}

// Release holds the checks of a published release.
type Release mg.Namespace

// Proves a published release came from its source: signatures and a rebuild.
//
// Checks every index and platform manifest signature, the SLSA provenance
// (naming the tag's commit) and SBOM attestations with the public key; then
// checks out the tag's commit into a temporary clone, rebuilds every image
// for every release platform (the tag's kiln.yaml release.platforms) in
// isolation and compares each with the registry's, locating any difference
// (image, platform, layer, file, ELF section). Release assets, when given,
// are checked against SHA256SUMS and its signature; the binaries are
// rebuilt and compared, and the manifests (release.manifests) compared
// with the tag's files pinned to the images the registry serves.
// Exits non-zero unless all is identical and verified.
//
//	VERSION                 the released tag, e.g. v2.3.0
//	-registry=HOST[:PORT]   where it was released (or REGISTRY)
//	-key=FILE               cosign.pub or env://VAR (default kiln.yaml signing.publicKey)
//	-assets=DIR             the release assets with SHA256SUMS and its .sig, as
//	                        downloaded (default _output/release/VERSION when
//	                        there); checked, and rebuilt or pinned and compared
//	-platforms=P,...        rebuild and compare these release platforms only,
//	                        manifest by manifest (every signature is still checked)
//	-skiptlsverify          as for images:push
//	-progress               as for images
func (Release) Verify(ctx context.Context, version string, registry *string, key *string, assets *string, platforms *string, skiptlsverify *bool, progress *string) error {
	out, err := release.VerifyRelease(ctx, cli.Options(platforms, nil, progress), release.VerifyReleaseOptions{
		PushOptions: publish.PushOptions{Registry: cli.Str(registry), SkipTLSVerify: cli.Bool(skiptlsverify)},
		Version:     version, PublicKey: cli.Str(key), Assets: cli.Str(assets),
	})
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	fmt.Printf("release %s, commit %s:\n", out.Version, out.Commit)
	for _, img := range out.Images {
		same := "identical to its rebuild"
		if len(img.Compared) < len(img.Platforms) {
			same = "identical to its rebuild on " + strings.Join(img.Compared, ", ")
		}
		if !img.Identical {
			same = "DIFFERENT from its rebuild " + img.Rebuilt
		}
		fmt.Printf("  %s %s [%s] %d signatures and %d attestations verified, %s\n", img.Ref, img.Digest, strings.Join(img.Platforms, ", "), img.Signatures, img.Attestations, same)
		for _, p := range img.Problems {
			fmt.Printf("    NOT VERIFIED: %s\n", p)
		}
	}
	switch a := out.Assets; {
	case a.Dir == "":
		fmt.Println("  release assets not checked: pass -assets=DIR with them, SHA256SUMS and SHA256SUMS.sig")
	default:
		fmt.Printf("  release assets in %s: %d match the signed SHA256SUMS, %d identical to their rebuild or pinning\n", a.Dir, len(a.Verified), len(a.Compared))
		for _, p := range a.Problems {
			fmt.Printf("    NOT VERIFIED: %s\n", p)
		}
	}
	if out.OK() {
		return nil
	}
	if len(out.Differences) > 0 {
		fmt.Println("\nwhere the registry's images differ from the source's:")
		for _, d := range out.Differences {
			fmt.Println("  " + d.String())
		}
	}
	return fmt.Errorf("release %s does not verify: see the signatures not verified and the differences from what commit %s builds above", out.Version, out.Commit)
}

// Bench holds the benchmark report tools.
type Bench mg.Namespace

// Compares two bench reports: the median of each scenario, old and new.
func (Bench) Compare(oldReport, newReport string) error {
	return bench.CompareFiles(os.Stdout, oldReport, newReport)
}

// Buildkit manages the BuildKit daemon kiln builds on.
type Buildkit mg.Namespace

// Shows the daemon kiln would use, its workers and its disk use by kind.
func (Buildkit) Status(ctx context.Context) error {
	cli.Logging()
	return managed.Status(ctx, ".", os.Stdout)
}

// Stops the managed buildkitd (a daemon named by BUILDKIT_HOST is left alone).
func (Buildkit) Stop(ctx context.Context) error {
	cli.Logging()
	if os.Getenv(buildkit.HostEnv) != "" {
		return fmt.Errorf("%s is set: kiln does not stop a daemon it did not start", buildkit.HostEnv)
	}
	m, err := managed.DefaultManaged(".")
	if err != nil {
		return err
	}
	stopped, err := m.Stop(ctx)
	if err != nil {
		return err
	}
	if stopped {
		fmt.Println("managed buildkitd stopped")
	} else {
		fmt.Println("managed buildkitd was not running")
	}
	return nil
}

// Installs what the managed daemon needs and builds it, once.
//
// runc from Debian's packages when it is missing (as root on Debian; kiln
// never installs anything unasked otherwise), then buildkitd from the Go
// module proxy into the kiln cache.
func (Buildkit) Setup(ctx context.Context) error {
	cli.Logging()
	if err := managed.InstallRunc(ctx); err != nil {
		return err
	}
	m, err := managed.DefaultManaged(".")
	if err != nil {
		return err
	}
	if err := m.EnsureBinary(ctx); err != nil {
		return err
	}
	fmt.Printf("runc found; buildkitd %s at %s\n", managed.Version, m.Binary())
	return nil
}

// Frees the daemon's build cache, keeping the Go cache mounts, the local transfer state, the last module layer and kiln's step tool.
//
//	-all   remove those too
func (Buildkit) Prune(ctx context.Context, all *bool) error {
	cli.Logging()
	return managed.Prune(ctx, ".", cli.Bool(all), os.Stdout)
}
