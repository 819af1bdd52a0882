// Package targets is kiln's top-level mage targets (images, binaries, plan,
// verify, size, doctor, explain, bench, release). A repository adds kiln by
// importing this package and targets/namespaces in its magefile:
//
//	import (
//		//mage:import
//		_ "github.com/kiln-build/kiln/targets"
//		//mage:import
//		_ "github.com/kiln-build/kiln/targets/namespaces"
//	)
//
// Targets build the project in the directory mage runs them in (where
// build/kiln.yaml is). Each one parses its flags, calls the engine and
// prints the result.
package targets

//mage:multiline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-build/kiln/internal/bench"
	"github.com/kiln-build/kiln/internal/cli"
	"github.com/kiln-build/kiln/internal/explain"
	"github.com/kiln-build/kiln/internal/gocache"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/release"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/spread"
	"github.com/kiln-build/kiln/internal/verify"
)

// Builds every image as an OCI layout tarball under _output/images/.
//
// Static linking and size budgets are checked after the build.
//
//	-platforms=linux/amd64,linux/arm64   target platforms (or PLATFORMS)
//	-stamp                               release stamping: version, commit, tree state
//	-progress=auto|tty|plain|quiet|rawjson
//	-images=antrea-agent,…               build only these images
//	-explain                             say which steps ran and why
//	-cacheto, -cachefrom=type=registry,ref=HOST/REPO,mode=max
//	                                     a shared layer cache (default: kiln.yaml cache.to/from)
//	-gocacheto, -gocachefrom=HOST/REPO   publish or seed from a Go build cache snapshot
//	-rebuild                             build even when the tarballs are up to date
//	-metadata=FILE                       write what was made as JSON: each image's
//	                                     reference, index and platform digests, path
//
// A tarball made from the same inputs (every file the go command reads, the
// toolchain, stamps, flags, modules, image.yaml and its files, the build
// graph, kiln itself) is kept as it is: builds are reproducible, so building
// it again would write the same bytes.
//
// BUILDKIT_HOST=A,B,... spreads the platforms over several daemons (those
// kiln.yaml's builders prefer first) and merges each image's parts into
// the tarball one daemon writes (such a build always solves, and exports
// no cache).
//
//	-retryelsewhere                      with several daemons, rebuild the platforms of
//	                                     one that fails on one that finished (not when
//	                                     a step failed: a compile error fails anywhere)
func Images(ctx context.Context, platforms *string, stamp *bool, progress *string, images *string, explain *bool, cacheto *string, cachefrom *string, gocacheto *string, gocachefrom *string, rebuild *bool, metadata *string, retryelsewhere *bool) error {
	o := cli.Options(platforms, stamp, progress)
	o.Images, o.Rebuild, o.RetryElsewhere = cli.List(images), cli.Bool(rebuild), cli.Bool(retryelsewhere)
	o.CacheTo, o.CacheFrom = cli.Str(cacheto), cli.Str(cachefrom)
	o.GoCacheTo, o.GoCacheFrom = cli.Str(gocacheto), cli.Str(gocachefrom)
	outcome, err := spread.Images(ctx, o)
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	var kept []string
	for _, r := range outcome.Images {
		fmt.Printf("%s\t%s\t%s\t%s\n", r.Ref, r.Digest, r.Path, r.Platforms)
		if r.Kept {
			kept = append(kept, r.Name)
		}
	}
	if len(kept) > 0 {
		fmt.Fprintf(os.Stderr, "up to date, not rebuilt (no input changed since they were written; -rebuild builds anyway): %s\n", strings.Join(kept, ", "))
	}
	printGoCache(outcome.GoCache)
	if cli.Str(metadata) != "" {
		if err := outcome.WithManifests(); err != nil {
			return err
		}
		if err := cli.WriteMetadata(cli.Str(metadata), map[string]any{"images": outcome.Images}); err != nil {
			return err
		}
	}
	if cli.Bool(explain) {
		fmt.Println()
		explainWrite(outcome.Explanations)
	}
	if outcome.Checks != nil {
		return outcome.Checks.Err()
	}
	return nil
}

// Builds the raw binaries into _output/bin/<os>_<arch>[_<variant>]/.
//
// Flags as for images, and:
//
//	-module=DIR -packages=./cmd/a,./cmd/b   build another Go module's (or go.work
//	                                        workspace's) main packages with this
//	                                        repository's toolchain and platforms
//	-rebuild                                build even when the binaries are up to date
func Binaries(ctx context.Context, platforms *string, stamp *bool, progress *string, module *string, packages *string, gocacheto *string, gocachefrom *string, rebuild *bool) error {
	o := cli.Options(platforms, stamp, progress)
	o.Rebuild = cli.Bool(rebuild)
	o.GoCacheTo, o.GoCacheFrom = cli.Str(gocacheto), cli.Str(gocachefrom)
	o.Module, o.Packages = cli.Str(module), cli.List(packages)
	out, err := session.Binaries(ctx, o)
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	fmt.Println(out.Dir)
	if out.Kept {
		fmt.Fprintln(os.Stderr, "up to date, not rebuilt (no input changed since they were written; -rebuild builds anyway)")
	} else {
		fmt.Fprintln(os.Stderr, changedBinaries(out))
	}
	printGoCache(out.GoCache)
	return nil
}

// changedBinaries names the binaries whose bytes changed: the others were
// kept as they were, so their files did not move.
func changedBinaries(out *session.BinariesOutcome) string {
	if len(out.Sent) == 0 {
		return "built; no binary changed"
	}
	var names []string
	for _, f := range out.Sent {
		rel, err := filepath.Rel(out.Dir, f)
		if err != nil {
			rel = f
		}
		names = append(names, rel)
	}
	return "changed: " + strings.Join(names, " ")
}

func printGoCache(r *gocache.Result) {
	if r != nil {
		fmt.Printf("Go cache snapshot\t%s\t%s\n", r.Digest, strings.Join(r.Refs, ","))
	}
}

func explainWrite(ex []explain.Explanation) { explain.Write(os.Stdout, ex) }

// Prints the resolved build without building.
//
// Toolchain, platforms, stamp, cache ids, the one Go environment, each
// binary's source files and the images.
//
//	-json                 for machines
//	-platforms, -stamp    as for images
func Plan(json *bool, platforms *string, stamp *bool) error {
	p, err := session.Plan(cli.Options(platforms, stamp, nil))
	if err != nil {
		return err
	}
	if cli.Bool(json) {
		return cli.WritePlanJSON(os.Stdout, p)
	}
	cli.WritePlanText(os.Stdout, p)
	return nil
}

// Checks what the last images build produced, building first if needed.
//
// Cache drift, static linking of every binary in every image and size
// budgets naming what grew. Prints a table; fails if any check fails.
//
//	-platforms, -progress   as for images
func Verify(ctx context.Context, platforms *string, progress *string) error {
	report, err := verify.Verify(ctx, cli.Options(platforms, nil, progress))
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	if err := report.WriteTable(os.Stdout); err != nil {
		return err
	}
	if n := report.Failed(); n > 0 {
		return fmt.Errorf("%d of %d checks failed", n, len(report.Checks))
	}
	return nil
}

// Explains the last build: which steps were reused, and why the others ran.
//
// For each step that ran, the input that changed since the build before it:
// a file of that binary's packages, go.mod/go.sum, toolchain, flags, stamp.
func Explain() error {
	cli.Logging()
	ex, err := session.Explain(session.Options{})
	if err != nil {
		return err
	}
	explainWrite(ex)
	return nil
}

// Lists every way the configuration would split the Go build cache.
//
// Per-binary CGO_ENABLED, tags, gcflags, -trimpath, GOFLAGS, GOAMD64/GOARM
// and volatile -X values, each with its cost and fix.
func Doctor() error {
	cli.Logging()
	findings, err := verify.Doctor(session.Options{})
	if err != nil {
		return err
	}
	if len(findings) == 0 {
		fmt.Println("no cache drift: every binary builds with one Go environment and stable linker flags")
		return nil
	}
	failures := 0
	for _, f := range findings {
		label := ""
		if f.Warning {
			label = "warning: "
		} else {
			failures++
		}
		fmt.Printf("%s%s\n  %s\n  cost: %s\n  fix:  %s\n\n", label, f, strings.Join(f.Binaries, ", "), f.Cost, f.Fix)
	}
	if failures == 0 {
		return nil
	}
	return fmt.Errorf("%d cache-drift findings", failures)
}

// Reports each binary's size per platform and what each module contributes.
//
// Bytes per module and package (from an unstripped link of the same inputs)
// and the change since the last report; writes _output/size/report.json and
// report.svg.
//
//	-platforms, -progress   as for images
func Size(ctx context.Context, platforms *string, progress *string) error {
	report, err := verify.Size(ctx, cli.Options(platforms, nil, progress))
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	if err := report.WriteTable(os.Stdout); err != nil {
		return err
	}
	jsonPath, svgPath, _ := verify.SizePaths(session.Options{})
	fmt.Printf("\nreport: %s\nchart:  %s\n", jsonPath, svgPath)
	return nil
}

// Times kiln against native go build of the same binaries, in one run.
//
// Scenarios: native cold, warm and incremental; kiln cold, cold with Go
// caches kept, warm no-op, incremental edits to one binary's package and to a
// shared one; a fresh daemon building an edited commit from a registry layer
// cache, with and without a Go cache snapshot; the cgo split experiment.
// Writes _output/bench/{latest.json,report.md,chart.svg}.
//
//	-runs=N                        runs of each scenario but the fresh-daemon, cgo and
//	                               side-by-side ones (default 3; native and kiln, or one
//	                               daemon and the nodes, take turns)
//	-module=DIR                    bench another module, with -packages=./cmd/a,./cmd/b
//	-module=modcache:PATH@VERSION  a module copied from the module cache
//	-vendor                        vendor that copy first (go mod vendor)
//	-platforms                     as for images
//	-only=cold,noop,kept,edits,fresh,cgo,daemons
//	                               run these figures' scenarios only, with the cold
//	                               runs they start from (default: every one but daemons)
//	-daemons=N                     daemons: the platforms dealt to N daemons (default 3),
//	                               each node's share timed alone, and the projection
//	                               for N machines (the longest node against one daemon)
//	-registry=HOST[:PORT]          for the fresh-daemon scenarios (default REGISTRY,
//	                               else a docker-registry started on loopback)
//	-compare=OLD.json,NEW.json     compare two reports instead
func Bench(ctx context.Context, runs *int, module *string, packages *string, vendor *bool, platforms *string, only *string, compare *string, registry *string, daemons *int) error {
	cli.Logging()
	if compare != nil {
		files := strings.Split(*compare, ",")
		if len(files) != 2 {
			return fmt.Errorf("-compare takes two reports: -compare=OLD.json,NEW.json")
		}
		return bench.CompareFiles(os.Stdout, files[0], files[1])
	}
	o := bench.Options{Build: cli.Options(platforms, nil, nil), Registry: cli.Str(registry), Only: cli.List(only)}
	if runs != nil {
		o.Runs = *runs
	}
	if daemons != nil {
		o.Daemons = *daemons
	}
	if module != nil {
		dir := *module
		if mod, ok := strings.CutPrefix(dir, "modcache:"); ok {
			copyDir, cleanup, err := bench.CopyFromModuleCache(ctx, mod, cli.Bool(vendor))
			if err != nil {
				return err
			}
			defer cleanup()
			dir = copyDir
		}
		o.Build.Module = dir
		if root, err := os.Getwd(); err == nil {
			o.Out = filepath.Join(root, "_output", "bench")
		}
	}
	o.Build.Packages = cli.List(packages)
	report, files, err := bench.Run(ctx, o)
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	if err := report.WriteTable(os.Stdout); err != nil {
		return err
	}
	fmt.Printf("\n%s\n", strings.Join(files, "\n"))
	return nil
}

// The release pipeline: stamped release assets and every image pushed.
//
// Stamps version (git describe or VERSION), commit and tree state (a dirty
// tree refuses unless -force); pushes every image for every platform of
// release.platforms (default: platforms); signs every index and platform
// manifest and attaches a signed SLSA v1 provenance and SPDX SBOMs, all
// verifiable with cosign; writes the release assets with SHA256SUMS and
// SHA256SUMS.sig under _output/release/<version>/: the binaries of kiln.yaml
// release.assets and the YAML files of release.manifests with every
// reference to one of the images pinned to its digest, as images:resolve
// pins them (no folder when both name none). The key is KILN_SIGNING_KEY (or kiln.yaml
// signing.key), a cosign.key whose password is in KILN_SIGNING_PASSWORD (or
// COSIGN_PASSWORD).
//
//	-registry=HOST[:PORT]   where images go (or REGISTRY)
//	-dryrun                 show what would be published
//	-latest, -skiptlsverify as for images:push
//	-force                  release a tree with uncommitted changes
//	-trustcaches            import the layer cache, seed Go cache snapshots and
//	                        reuse the daemon's cache, as other builds do
//	                        (recorded in the summary and the provenance); by
//	                        default a release reads no cache and every step
//	                        re-runs, on an empty Go cache of its own
//	-metadata=FILE          write the release summary as JSON: version, commit,
//	                        images with index and platform digests and the
//	                        signatures and attestations attached, assets
//	                        and manifests with their sha256
//	-retryelsewhere         as for images:push
//
// With several daemons (BUILDKIT_HOST=A,B,...) each builds and pushes its
// platforms and their assets; the indexes, signatures and attestations are
// the ones one daemon's release gives (the provenance lists every
// toolchain that compiled an image, on daemons of other platforms).
func Release(ctx context.Context, registry *string, latest *bool, skiptlsverify *bool, dryrun *bool, force *bool, progress *string, trustcaches *bool, metadata *string, retryelsewhere *bool) error {
	o := cli.Options(nil, nil, progress)
	r := release.ReleaseOptions{
		PushOptions: publish.PushOptions{Registry: cli.Str(registry), Latest: cli.Bool(latest), SkipTLSVerify: cli.Bool(skiptlsverify), RetryElsewhere: cli.Bool(retryelsewhere)},
		DryRun:      cli.Bool(dryrun),
		Force:       cli.Bool(force),
		TrustCaches: cli.Bool(trustcaches),
	}
	sum, err := release.Release(ctx, o, r)
	if err != nil {
		return cli.Interrupted(ctx, err)
	}
	verb := "published"
	if sum.DryRun {
		verb = "would publish (dry run)"
	}
	fmt.Printf("release %s (commit %s, tree %s, caches %s) %s:\n", sum.Version, sum.Commit, sum.TreeState, sum.Caches, verb)
	for _, img := range sum.Images {
		fmt.Printf("  image %s [%s] %s\n", strings.Join(img.Refs, ", "), strings.Join(sum.Platforms, ", "), img.Digest)
	}
	for _, a := range sum.Assets {
		fmt.Printf("  asset %s/%s %s\n", sum.AssetsDir, a.Name, a.SHA256)
	}
	for _, m := range sum.Manifests {
		pinned := ""
		if !sum.DryRun {
			pinned = fmt.Sprintf(" %s (%d references pinned)", m.SHA256, m.References)
		}
		fmt.Printf("  manifest %s/%s from %s%s\n", sum.AssetsDir, m.Name, m.Source, pinned)
	}
	if !sum.DryRun && len(sum.Images) > 0 {
		fmt.Printf("signed; check with the public key:\n  cosign verify --key cosign.pub --insecure-ignore-tlog %s\n", sum.Images[0].Refs[0])
		if sum.AssetsDir != "" {
			fmt.Printf("  cosign verify-blob --key cosign.pub --insecure-ignore-tlog --signature %s/SHA256SUMS.sig %s/SHA256SUMS\n", sum.AssetsDir, sum.AssetsDir)
		}
		fmt.Printf("  mage release:verify %s\n", sum.Version)
	}
	return cli.WriteMetadata(cli.Str(metadata), sum)
}
