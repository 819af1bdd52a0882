//go:build mage

// kiln builds the Antrea-shaped binaries of this repository into
// reproducible multi-arch OCI images through BuildKit. The names
// images:load, images:smoke, images:push, verify:repro and bench:compare
// are aliases of imagesLoad, imagesSmoke, imagesPush, verifyRepro and
// benchCompare.
//
// Environment: BUILDKIT_HOST (a daemon to use instead of the managed one),
// BUILDKIT_TLS_DIR or BUILDKIT_TLS_CA_CERT, BUILDKIT_TLS_CERT and
// BUILDKIT_TLS_KEY (mutual TLS to a tcp:// daemon), PLATFORMS (comma-separated target platforms), KILN_PROGRESS (auto, tty,
// plain, quiet, rawjson), SOURCE_DATE_EPOCH (overrides the commit time),
// KILN_CACHE_DIR (where the managed daemon and toolchain live).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/magefile/mage/mg"
	"github.com/sirupsen/logrus"

	"github.com/kiln-build/kiln/pkg/bench"
	"github.com/kiln-build/kiln/pkg/build"
	"github.com/kiln-build/kiln/pkg/buildkit"
	explainpkg "github.com/kiln-build/kiln/pkg/explain"
)

// logging is quiet unless mage runs with -v.
func logging() {
	logrus.SetOutput(os.Stderr)
	logrus.SetLevel(logrus.WarnLevel)
	if mg.Verbose() {
		logrus.SetLevel(logrus.InfoLevel)
	}
}

// interrupted gives an error the exit code 130 when Ctrl-C (or mage -t)
// cancelled the target, as shells expect of an interrupted command.
func interrupted(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return mg.Fatalf(130, "interrupted: %v", err)
	}
	return err
}

func options(platforms *string, stamp *bool, progress *string) build.Options {
	logging()
	var o build.Options
	if platforms != nil {
		o.Platforms = *platforms
	}
	if stamp != nil {
		o.Stamp = *stamp
	}
	if progress != nil {
		o.Progress = *progress
	}
	return o
}

// Builds every image as an OCI layout tarball under _output/images/, then checks static linking and size budgets. Flags: -platforms=linux/amd64,linux/arm64 (or PLATFORMS), -stamp for release stamping, -progress=auto|tty|plain|quiet|rawjson, -explain to say which steps ran and why, -cacheto/-cachefrom=type=registry,ref=HOST/REPO,mode=max for a shared layer cache (default: build/kiln.yaml cache.to/from), -gocacheto/-gocachefrom=HOST/REPO to publish or seed from a Go build cache snapshot.
func Images(ctx context.Context, platforms *string, stamp *bool, progress *string, explain *bool, cacheto *string, cachefrom *string, gocacheto *string, gocachefrom *string) error {
	o := options(platforms, stamp, progress)
	setCache(&o, cacheto, cachefrom)
	setGoCache(&o, gocacheto, gocachefrom)
	outcome, err := build.Images(ctx, o)
	if err != nil {
		return interrupted(ctx, err)
	}
	for _, r := range outcome.Images {
		fmt.Printf("%s\t%s\t%s\t%s\n", r.Ref, r.Digest, r.Path, r.Platforms)
	}
	printGoCache(outcome.GoCache)
	if explain != nil && *explain {
		fmt.Println()
		explainpkg.Write(os.Stdout, outcome.Explanations)
	}
	if outcome.Checks != nil {
		return outcome.Checks.Err()
	}
	return nil
}

// Checks what the last build produced (building first if nothing is there): cache drift, static linking of every binary, size budgets with what grew. Prints a table; fails if any check fails.
func Verify(ctx context.Context, platforms *string, progress *string) error {
	report, err := build.Verify(ctx, options(platforms, nil, progress))
	if err != nil {
		return interrupted(ctx, err)
	}
	if err := report.WriteTable(os.Stdout); err != nil {
		return err
	}
	if n := report.Failed(); n > 0 {
		return fmt.Errorf("%d of %d checks failed", n, len(report.Checks))
	}
	return nil
}

// Explains the last build: which steps were reused, and for each one that ran, which input changed since the build before it.
func Explain() error {
	logging()
	ex, err := build.Explain(build.Options{})
	if err != nil {
		return err
	}
	explainpkg.Write(os.Stdout, ex)
	return nil
}

// Lists every way the configuration would split the Go build cache or relink needlessly, with what it costs and how to fix it.
func Doctor() error {
	logging()
	findings, err := build.Doctor(build.Options{})
	if err != nil {
		return err
	}
	if len(findings) == 0 {
		fmt.Println("no cache drift: every binary builds with one Go environment and stable linker flags")
		return nil
	}
	for _, f := range findings {
		fmt.Printf("%s\n  %s\n  cost: %s\n  fix:  %s\n\n", f, strings.Join(f.Binaries, ", "), f.Cost, f.Fix)
	}
	return fmt.Errorf("%d cache-drift findings", len(findings))
}

// Builds the raw binaries into _output/bin/<os>_<arch>/. Flags as for images, and -module=DIR -packages=./cmd/a,./cmd/b to build another Go module's (or go.work workspace's) main packages with this repository's toolchain and platforms.
func Binaries(ctx context.Context, platforms *string, stamp *bool, progress *string, module *string, packages *string, gocacheto *string, gocachefrom *string) error {
	o := options(platforms, stamp, progress)
	setGoCache(&o, gocacheto, gocachefrom)
	if module != nil {
		o.Module = *module
	}
	if packages != nil {
		o.Packages = strings.Split(*packages, ",")
	}
	out, err := build.Binaries(ctx, o)
	if err != nil {
		return interrupted(ctx, err)
	}
	fmt.Println(out.Dir)
	printGoCache(out.GoCache)
	return nil
}

func setGoCache(o *build.Options, to, from *string) {
	if to != nil {
		o.GoCacheTo = *to
	}
	if from != nil {
		o.GoCacheFrom = *from
	}
}

func printGoCache(r *build.GoCacheResult) {
	if r != nil {
		fmt.Printf("Go cache snapshot\t%s\t%s\n", r.Digest, strings.Join(r.Refs, ","))
	}
}

// Prints the resolved build (toolchain, platforms, binaries, images, cache ids, Go environment) without building. -json for machines.
func Plan(json *bool, platforms *string, stamp *bool) error {
	p, err := build.Plan(options(platforms, stamp, nil))
	if err != nil {
		return err
	}
	if json != nil && *json {
		return build.WritePlanJSON(os.Stdout, p)
	}
	build.WritePlanText(os.Stdout, p)
	return nil
}

// Buildkit manages the BuildKit daemon kiln builds on.
type Buildkit mg.Namespace

// Shows the daemon kiln would use, its workers and its disk use by kind.
func (Buildkit) Status(ctx context.Context) error {
	logging()
	return buildkit.Status(ctx, ".", os.Stdout)
}

// Stops the managed buildkitd (a daemon named by BUILDKIT_HOST is left alone).
func (Buildkit) Stop(ctx context.Context) error {
	logging()
	if os.Getenv(buildkit.HostEnv) != "" {
		return fmt.Errorf("%s is set: kiln does not stop a daemon it did not start", buildkit.HostEnv)
	}
	m, err := buildkit.DefaultManaged(".")
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

// Frees the daemon's build cache, keeping the Go cache mounts; -all removes those too.
func (Buildkit) Prune(ctx context.Context, all *bool) error {
	logging()
	return buildkit.Prune(ctx, ".", all != nil && *all, os.Stdout)
}

// Reports each binary's size per platform, the bytes each module and package contributes, and the change since the last report; writes _output/size/report.json and report.svg.
func Size(ctx context.Context, platforms *string, progress *string) error {
	report, err := build.Size(ctx, options(platforms, nil, progress))
	if err != nil {
		return interrupted(ctx, err)
	}
	if err := report.WriteTable(os.Stdout); err != nil {
		return err
	}
	jsonPath, svgPath, _ := build.SizePaths(build.Options{})
	fmt.Printf("\nreport: %s\nchart:  %s\n", jsonPath, svgPath)
	return nil
}

// Aliases give the namespaced names to targets whose plain name is taken.
var Aliases = map[string]any{
	"verify:repro":  VerifyRepro,
	"images:push":   ImagesPush,
	"bench:compare": BenchCompare,
}

// Builds and pushes every image, all platforms in one index, to -registry=HOST[:PORT] (or REGISTRY) as <registry>/<repository>/<image>:<version>; -latest adds latest, -insecure allows plain HTTP beyond loopback. Credentials come from the Docker config (DOCKER_CONFIG). Alias: images:push.
func ImagesPush(ctx context.Context, registry *string, latest *bool, insecure *bool, platforms *string, stamp *bool, progress *string, cacheto *string, cachefrom *string) error {
	var p build.PushOptions
	if registry != nil {
		p.Registry = *registry
	}
	p.Latest = latest != nil && *latest
	p.Insecure = insecure != nil && *insecure
	o := options(platforms, stamp, progress)
	setCache(&o, cacheto, cachefrom)
	results, err := build.Push(ctx, o, p)
	if err != nil {
		return interrupted(ctx, err)
	}
	for _, r := range results {
		fmt.Printf("%s\t%s\n", strings.Join(r.Refs, ","), r.Digest)
	}
	return nil
}

// Builds every image and streams it into containerd (-address or CONTAINERD_ADDRESS, -namespace default k8s.io), all platforms, index digest intact, named <repository>/<image>:<tag>. Alias: images:load.
func ImagesLoad(ctx context.Context, address *string, namespace *string, platforms *string, stamp *bool, progress *string) error {
	results, err := build.Load(ctx, options(platforms, stamp, progress), loadOptions(address, namespace))
	if err != nil {
		return interrupted(ctx, err)
	}
	for _, r := range results {
		fmt.Printf("%s\t%s\n", r.Ref, r.Digest)
	}
	return nil
}

// Runs every binary of every loaded image with --version under containerd, on each platform (arm through qemu binfmt), and checks version, commit, platform and cgo off. Alias: images:smoke.
func ImagesSmoke(ctx context.Context, address *string, namespace *string, platforms *string, stamp *bool) error {
	results, err := build.Smoke(ctx, options(platforms, stamp, nil), loadOptions(address, namespace))
	if err != nil {
		return interrupted(ctx, err)
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

func setCache(o *build.Options, to, from *string) {
	if to != nil {
		o.CacheTo = *to
	}
	if from != nil {
		o.CacheFrom = *from
	}
}

func loadOptions(address, namespace *string) build.LoadOptions {
	var o build.LoadOptions
	if address != nil {
		o.Address = *address
	}
	if namespace != nil {
		o.Namespace = *namespace
	}
	return o
}

// Compares two bench reports: the median of each scenario, old and new. Alias: bench:compare.
func BenchCompare(oldReport, newReport string) error {
	old, err := bench.Read(oldReport)
	if err != nil {
		return err
	}
	new, err := bench.Read(newReport)
	if err != nil {
		return err
	}
	return bench.Compare(os.Stdout, old, new)
}

// Builds every image twice, the second time in isolation (no reused step, an empty Go cache), and compares every index, manifest, config, layer, file and ELF section. Alias: verify:repro.
func VerifyRepro(ctx context.Context, platforms *string, progress *string) error {
	out, err := build.Repro(ctx, options(platforms, nil, progress))
	if err != nil {
		return interrupted(ctx, err)
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

// Times kiln (cold, cold with Go caches kept, warm no-op, incremental edits to one binary's package and to a shared one, a fresh daemon building an edited commit from a registry layer cache with and without a Go cache snapshot) against native go build in one run, plus the cgo split experiment; writes _output/bench/{latest.json,report.md,chart.svg}. Flags: -runs=N (warm and incremental, default 3), -module=DIR or -module=modcache:PATH@VERSION with -packages=./cmd/a,./cmd/b to bench another module, -platforms, -registry=HOST[:PORT] for the fresh-daemon scenarios (default REGISTRY, else a docker-registry started on loopback), -compare=OLD.json,NEW.json to compare two reports instead.
func Bench(ctx context.Context, runs *int, module *string, packages *string, platforms *string, compare *string, registry *string) error {
	logging()
	if compare != nil {
		files := strings.Split(*compare, ",")
		if len(files) != 2 {
			return fmt.Errorf("-compare takes two reports: -compare=OLD.json,NEW.json")
		}
		old, err := bench.Read(files[0])
		if err != nil {
			return err
		}
		new, err := bench.Read(files[1])
		if err != nil {
			return err
		}
		return bench.Compare(os.Stdout, old, new)
	}
	o := bench.Options{Build: options(platforms, nil, nil)}
	if registry != nil {
		o.Registry = *registry
	}
	if runs != nil {
		o.Runs = *runs
	}
	if module != nil {
		dir := *module
		if mod, ok := strings.CutPrefix(dir, "modcache:"); ok {
			copyDir, cleanup, err := bench.CopyFromModuleCache(ctx, mod)
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
	if packages != nil {
		o.Build.Packages = strings.Split(*packages, ",")
	}
	report, files, err := bench.Run(ctx, o)
	if err != nil {
		return interrupted(ctx, err)
	}
	if err := report.WriteTable(os.Stdout); err != nil {
		return err
	}
	fmt.Printf("\n%s\n", strings.Join(files, "\n"))
	return nil
}

// The release pipeline: stamps version (git describe or VERSION), commit and tree state (a dirty tree refuses unless -force), writes the release assets with SHA256SUMS under _output/release/<version>/, and pushes every image for linux/amd64, linux/arm64 and linux/arm/v7 with provenance and SBOM attestations to -registry (or REGISTRY). -dryrun shows what would be published; -latest, -insecure as for images:push.
func Release(ctx context.Context, registry *string, latest *bool, insecure *bool, dryrun *bool, force *bool, progress *string) error {
	o := options(nil, nil, progress)
	var r build.ReleaseOptions
	if registry != nil {
		r.Registry = *registry
	}
	r.Latest = latest != nil && *latest
	r.Insecure = insecure != nil && *insecure
	r.DryRun = dryrun != nil && *dryrun
	r.Force = force != nil && *force
	sum, err := build.Release(ctx, o, r)
	if err != nil {
		return interrupted(ctx, err)
	}
	verb := "published"
	if sum.DryRun {
		verb = "would publish (dry run)"
	}
	fmt.Printf("release %s (commit %s, tree %s) %s:\n", sum.Version, sum.Commit, sum.TreeState, verb)
	for _, img := range sum.Images {
		fmt.Printf("  image %s [%s] %s\n", strings.Join(img.Refs, ", "), strings.Join(sum.Platforms, ", "), img.Digest)
	}
	for _, a := range sum.Assets {
		fmt.Printf("  asset %s/%s %s\n", sum.AssetsDir, a.Name, a.SHA256)
	}
	return nil
}
