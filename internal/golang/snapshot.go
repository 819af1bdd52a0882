package golang

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"

	"github.com/moby/buildkit/client/llb"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/plan"
)

// LocalGoCacheSnapshot is the local source of a verified Go cache snapshot.
const LocalGoCacheSnapshot = "gocache-snapshot"

// kilnstepSources are kilnstep's files, tests left out.
//
//go:embed kilnstep/main.go kilnstep/modules.go
var kilnstepSources embed.FS

// LocalStepTool is the local source of a kilnstep binary kiln built
// before and keeps on the client (UseStepTool).
const LocalStepTool = "kiln-step-tool"

// StepToolKey names the kilnstep BuildStepTool makes by a digest of its
// whole definition: source, toolchain, platform and how it is built. The
// build is reproducible, so one key is one binary.
func (g *Graph) StepToolKey(ctx context.Context) (string, error) {
	def, err := g.BuildStepTool().Marshal(ctx, llb.Platform(g.Plan.BuildPlatform))
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, op := range def.Def {
		h.Write(op)
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

// UseStepTool makes every step take kilnstep from dir on the client (the
// file StepToolFile there, a BuildStepTool export) rather than build it.
// Building it puts the standard library's compile, one package at a time
// at its start, before every go build; sent, it costs a 4 MB transfer, and
// the go builds start as soon as the toolchain is unpacked. Steps that use
// it are keyed on its content, which is the same on every machine.
func (g *Graph) UseStepTool(dir string) {
	st := llb.Local(LocalStepTool, LocalID(dir),
		llb.IncludePatterns([]string{StepToolFile}),
		llb.SharedKeyHint(LocalStepTool),
		llb.WithCustomName("[go] kilnstep"))
	g.tool = &st
}

// StepToolFile is the file name of kilnstep in BuildStepTool's output.
const StepToolFile = "kilnstep"

// stepTool is kilnstep as the steps mount it at /kiln/bin.
func (g *Graph) stepTool() llb.State {
	if g.tool != nil {
		return *g.tool
	}
	return g.BuildStepTool()
}

// BuildStepTool builds kilnstep for the build platform with the pinned
// toolchain. It shares the build's GOCACHE (as it was before any seeding),
// whose standard library packages the binaries need as well, and writes to
// ToolsDir, so buildkit:prune keeps it.
func (g *Graph) BuildStepTool() llb.State {
	// Reading what go:embed holds cannot fail.
	entries, _ := kilnstepSources.ReadDir("kilnstep")
	var names []string
	var files *llb.FileAction
	for _, e := range entries {
		data, _ := kilnstepSources.ReadFile("kilnstep/" + e.Name())
		if files == nil {
			files = llb.Mkfile("/"+e.Name(), 0o644, data)
		} else {
			files = files.Mkfile("/"+e.Name(), 0o644, data)
		}
		names = append(names, e.Name())
	}
	src := llb.Scratch().File(files, llb.WithCustomName("[go] kilnstep source"))
	run := g.base().Run(
		llb.Args(append([]string{goroot + "/bin/go", "build", "-trimpath", "-o", ToolsDir + "/" + StepToolFile}, names...)),
		llb.Dir(srcDir),
		llb.AddEnv("PATH", goroot+"/bin"),
		llb.AddEnv("HOME", "/root"),
		llb.AddEnv("GOCACHE", goCache),
		addEnv(plan.CgoOff),
		addEnv(plan.LocalToolchain),
		llb.AddEnv("GOWORK", "off"),
		llb.AddEnv("GOPROXY", "off"),
		llb.AddEnv("GOOS", g.Plan.BuildPlatform.OS),
		llb.AddEnv("GOARCH", g.Plan.BuildPlatform.Architecture),
		readOnlyLayer(goroot, g.Toolchain),
		llb.AddMount(srcDir, src, llb.Readonly),
		llb.AddMount(goCache, llb.Scratch(), llb.AsPersistentCacheDir(g.toolsGoCache, llb.CacheMountShared)),
		llb.AddMount("/tmp", llb.Scratch(), llb.Tmpfs()),
		llb.Network(llb.NetModeNone),
		llb.WithCustomName("[go] build kilnstep"),
	)
	return run.AddMount(ToolsDir, llb.Scratch())
}

type snapshotRun struct {
	Env  []string `json:"env"`
	Args []string `json:"args"`
}

// Snapshot is a directory of the GOCACHE entries (<xx>/<id>-a action and
// <xx>/<id>-d output files) of every package the binaries build for the
// targets: the same go list as Prepare, with GODEBUG=gocachehash=1 naming
// each action. Packages missing from GOCACHE are compiled first. It fails
// when the entries pass max bytes.
func (g *Graph) Snapshot(bins []plan.Binary, targets []ocispec.Platform, max int64) llb.State {
	args, union := g.packageArgs(bins)
	spec := struct {
		GoCache string        `json:"gocache"`
		Max     int64         `json:"max"`
		Runs    []snapshotRun `json:"runs"`
	}{GoCache: goCache, Max: max}
	for _, target := range targets {
		spec.Runs = append(spec.Runs, snapshotRun{Env: Env(g.Plan, target), Args: args})
	}
	dt, _ := json.Marshal(spec) // plain strings and numbers
	specDir := llb.Scratch().File(llb.Mkfile("/spec.json", 0o644, dt), llb.WithCustomName("[go cache] snapshot spec"))
	run := g.base().Run(append([]llb.RunOption{
		llb.Args([]string{"/kiln/bin/kilnstep", "snapshot", "/kiln/spec/spec.json", outDir}),
		llb.Dir(srcDir),
		llb.AddMount("/kiln/bin", g.stepTool(), llb.Readonly),
		llb.AddMount("/kiln/spec", specDir, llb.Readonly),
		readOnlyLayer(goroot, g.Toolchain),
		llb.AddMount(srcDir, g.Sources(union), llb.Readonly),
		readOnlyLayer(goModCache, g.Modules()),
		llb.AddMount(goCache, llb.Scratch(), llb.AsPersistentCacheDir(g.Plan.Cache.GoCache, llb.CacheMountShared)),
		llb.AddMount("/tmp", llb.Scratch(), llb.Tmpfs()),
		llb.Network(llb.NetModeNone),
		llb.WithCustomName("[go cache] snapshot"),
	}, g.vendorMounts()...)...)
	return run.AddMount(outDir, llb.Scratch())
}

// Seed makes every package step first add the entries of a verified
// snapshot (the local source LocalGoCacheSnapshot, from dir) that GOCACHE
// lacks. Call it before asking for any compile step.
func (g *Graph) Seed(dir, digest string) {
	snap := llb.Local(LocalGoCacheSnapshot, LocalID(dir), llb.SharedKeyHint(LocalGoCacheSnapshot),
		llb.WithCustomNamef("[go cache] snapshot %s", digest))
	run := g.base().Run(
		llb.Args([]string{"/kiln/bin/kilnstep", "seed", "/kiln/snapshot", goCache}),
		llb.AddMount("/kiln/bin", g.stepTool(), llb.Readonly),
		llb.AddMount("/kiln/snapshot", snap, llb.Readonly),
		llb.AddMount(goCache, llb.Scratch(), llb.AsPersistentCacheDir(g.Plan.Cache.GoCache, llb.CacheMountShared)),
		llb.Network(llb.NetModeNone),
		llb.WithCustomName("[go cache] seed GOCACHE from the snapshot"),
	)
	seeded := run.AddMount(outDir, llb.Scratch())
	g.seeded = &seeded
}
