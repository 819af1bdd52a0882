package image_test

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/solver/pb"
	"github.com/opencontainers/go-digest"

	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// testPlan resolves this repository's own configuration.
func testPlan(t *testing.T, platforms string) *plan.Plan {
	t.Helper()
	p, err := session.Plan(session.Options{Root: testdaemon.RepoRoot(t), Platforms: platforms})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type step struct {
	name string
	op   *pb.Op
}

// steps marshals every image of the plan for every platform and returns
// the ops, with their vertex names, of all definitions together.
func steps(t *testing.T, p *plan.Plan) ([]step, [][]byte) {
	t.Helper()
	return graphSteps(t, image.NewGraph(p, nil, nil), p)
}

// graphSteps is steps of the graph g made for p.
func graphSteps(t *testing.T, g *image.Graph, p *plan.Plan) ([]step, [][]byte) {
	t.Helper()
	var out []step
	var raw [][]byte
	for _, img := range p.Images {
		for _, st := range g.States(img) {
			def, err := st.Marshal(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, dt := range def.Def {
				raw = append(raw, dt)
				var op pb.Op
				if err := op.UnmarshalVT(dt); err != nil {
					t.Fatal(err)
				}
				name := def.Metadata[digestOf(dt)].Description["llb.customname"]
				out = append(out, step{name: name, op: &op})
			}
		}
	}
	return out, raw
}

func compileSteps(t *testing.T, all []step) []step {
	var out []step
	for _, s := range all {
		if e := s.op.GetExec(); e != nil && s.name != "[go] build kilnstep" && (e.Meta.Args[1] == "build" || e.Meta.Args[1] == "list" || e.Meta.Args[1] == "gobuild") {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		t.Fatal("no go build steps in the definition")
	}
	return out
}

func TestCompileStepsShareOneGoEnvironment(t *testing.T) {
	p := testPlan(t, "linux/amd64,linux/arm64,linux/arm/v7")
	all, _ := steps(t, p)
	var want []string
	compiles := compileSteps(t, all)
	// The environment to match is a go build's: the standard library steps
	// differ from it by design (no -ldflags).
	slices.SortStableFunc(compiles, func(a, b step) int {
		return cmpBool(strings.HasSuffix(a.name, "] standard library"), strings.HasSuffix(b.name, "] standard library"))
	})
	for _, s := range compiles {
		var env []string
		for _, kv := range s.op.GetExec().Meta.Env {
			switch k, _, _ := strings.Cut(kv, "="); k {
			case "GOOS", "GOARCH", "GOARM":
			default:
				env = append(env, kv)
			}
		}
		if !slices.Contains(env, "CGO_ENABLED=0") {
			t.Errorf("%s: CGO_ENABLED=0 missing from %v", s.name, env)
		}
		flags := buildFlags(s.op.GetExec().Meta.Args)
		if strings.HasSuffix(s.name, "] standard library") {
			// It links nothing: the go build's flags but -ldflags.
			ld := slices.IndexFunc(want, func(f string) bool { return strings.HasPrefix(f, "-ldflags=") })
			if ld < 0 {
				t.Fatalf("%s: no go build step with -ldflags to compare with", s.name)
			}
			flags = slices.Insert(flags, ld-len(env), want[ld])
		}
		env = append(env, flags...)
		if want == nil {
			want = env
			continue
		}
		if !slices.Equal(env, want) {
			t.Errorf("%s: Go environment differs:\n got %v\nwant %v", s.name, env, want)
		}
	}
	if !slices.Contains(want, "-trimpath") || !slices.Contains(want, "-buildvcs=false") {
		t.Errorf("build flags %v lack -trimpath or -buildvcs=false", want)
	}
}

func TestCompileStepsTargetEachPlatformFromTheBuildPlatform(t *testing.T) {
	p := testPlan(t, "linux/amd64,linux/arm64,linux/arm/v7")
	seen := map[string]bool{}
	for _, s := range compileSteps(t, mustSteps(t, p)) {
		if got := s.op.Platform; got.OS != p.BuildPlatform.OS || got.Architecture != p.BuildPlatform.Architecture {
			t.Errorf("%s runs on %s/%s, want the build platform %s", s.name, got.OS, got.Architecture, config.FormatPlatform(p.BuildPlatform))
		}
		env := s.op.GetExec().Meta.Env
		target := envValue(env, "GOOS") + "/" + envValue(env, "GOARCH")
		if arm := envValue(env, "GOARM"); arm != "" {
			target += "/v" + arm
		}
		if !strings.Contains(s.name, target+"]") && !strings.Contains(s.name, "["+target+"]") {
			t.Errorf("%s: targets %s, which its name does not say", s.name, target)
		}
		seen[target] = true
	}
	for _, want := range []string{"linux/amd64", "linux/arm64", "linux/arm/v7"} {
		if !seen[want] {
			t.Errorf("no compile step targets %s", want)
		}
	}
}

func TestCompileStepsHaveNoNetworkAndSharedCacheMounts(t *testing.T) {
	p := testPlan(t, "linux/amd64,linux/arm64,linux/arm/v7")
	for _, s := range compileSteps(t, mustSteps(t, p)) {
		e := s.op.GetExec()
		if e.Network != pb.NetMode_NONE {
			t.Errorf("%s: network mode %v, want none", s.name, e.Network)
		}
		var caches []string
		for _, m := range e.Mounts {
			if m.MountType == pb.MountType_CACHE {
				caches = append(caches, m.Dest+"="+m.CacheOpt.ID)
				// The kept binaries are written by one go build at a time;
				// the CPU tokens are taken by all at once; each step has a
				// /tmp of its own.
				shared := m.Dest == "/root/.cache/go-build" || m.Dest == "/kiln/cpus"
				want := pb.CacheSharingOpt_LOCKED
				switch {
				case shared:
					want = pb.CacheSharingOpt_SHARED
				case m.Dest == "/tmp":
					want = pb.CacheSharingOpt_PRIVATE
				}
				if m.CacheOpt.Sharing != want {
					t.Errorf("%s: cache %s is shared as %v", s.name, m.CacheOpt.ID, m.CacheOpt.Sharing)
				}
			}
		}
		want := []string{"/root/.cache/go-build=" + p.Cache.GoCache, "/tmp=" + golang.GoTmpCacheID}
		if strings.HasSuffix(s.name, "] standard library") {
			// It links nothing, so it keeps no binaries.
			want = append([]string{"/kiln/cpus=kiln-cpu-tokens"}, want...)
		} else if e.Meta.Args[1] == "gobuild" {
			target := envValue(e.Meta.Env, "GOOS") + "/" + envValue(e.Meta.Env, "GOARCH")
			if arm := envValue(e.Meta.Env, "GOARM"); arm != "" {
				target += "/v" + arm
			}
			want = append([]string{"/kiln/cpus=kiln-cpu-tokens", "/kiln/keep=" + p.Cache.GoCache + "-binaries-" + strings.ReplaceAll(target, "/", "-")}, want...)
		}
		if !slices.Equal(caches, want) {
			t.Errorf("%s: cache mounts %v, want %v", s.name, caches, want)
		}
		if v := envValue(e.Meta.Env, "GOCACHE"); v != "/root/.cache/go-build" {
			t.Errorf("%s: GOCACHE=%q does not point at the cache mount", s.name, v)
		}
	}
}

func TestCompileEnvironmentHoldsNothingOfTheHost(t *testing.T) {
	t.Setenv("KILN_CANARY", "host-value-must-not-leak")
	p := testPlan(t, "linux/amd64")
	_, raw := steps(t, p)
	for _, dt := range raw {
		if bytes.Contains(dt, []byte("host-value-must-not-leak")) {
			t.Fatal("a host environment variable reached the LLB definition")
		}
		if bytes.Contains(dt, []byte(p.Root)) {
			t.Fatalf("the host path %s reached the LLB definition", p.Root)
		}
	}
}

func TestCompileEnvironmentIsExactlyKilns(t *testing.T) {
	// The caller's module mode is honoured (issue 8); nothing else of GOFLAGS.
	t.Setenv("GOFLAGS", "-tags=hostonly -mod=mod")
	t.Setenv("GOAMD64", "v3")
	p := testPlan(t, "linux/amd64,linux/arm/v7")
	want := []string{"CGO_ENABLED", "GOARCH", "GOCACHE", "GOFLAGS", "GOMODCACHE", "GOOS", "GOPROXY", "GOSUMDB", "GOTOOLCHAIN", "HOME", "PATH"}
	for _, s := range compileSteps(t, mustSteps(t, p)) {
		var keys []string
		for _, kv := range s.op.GetExec().Meta.Env {
			k, _, _ := strings.Cut(kv, "=")
			if k != "GOARM" {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		if !slices.Equal(keys, want) {
			t.Errorf("%s: environment %v, want exactly %v", s.name, keys, want)
		}
		if v := envValue(s.op.GetExec().Meta.Env, "GOFLAGS"); v != "-mod=mod" {
			t.Errorf("%s: GOFLAGS=%q, want the caller's module mode alone (-mod=mod)", s.name, v)
		}
	}
}

func TestMarshalIsDeterministic(t *testing.T) {
	p := testPlan(t, "linux/amd64,linux/arm64")
	_, first := steps(t, p)
	for i := 0; i < 3; i++ {
		_, again := steps(t, p)
		if !slices.EqualFunc(first, again, bytes.Equal) {
			t.Fatal("marshalling the same plan twice gave different bytes")
		}
	}
}

func TestEveryVertexIsNamed(t *testing.T) {
	p := testPlan(t, "linux/amd64")
	for _, s := range mustSteps(t, p) {
		if s.op.GetSource() == nil && s.op.GetExec() == nil && s.op.GetFile() == nil {
			continue
		}
		if s.name == "" {
			t.Errorf("unnamed vertex: %v", s.op)
		}
	}
}

// buildFlags are the build flags after "go build" or "go list", up to the
// output, the list flags or the packages.
func buildFlags(args []string) []string {
	if i := slices.Index(args, "--"); args[1] == "gobuild" && i > 0 {
		args = args[i+1:] // kilnstep gobuild KEEP OUT NAMES -- go build ...
	}
	var flags []string
	for _, a := range args[2:] {
		if a == "-o" || a == "-e" || !strings.HasPrefix(a, "-") {
			break
		}
		flags = append(flags, a)
	}
	return flags
}

func mustSteps(t *testing.T, p *plan.Plan) []step {
	s, _ := steps(t, p)
	return s
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

func digestOf(dt []byte) digest.Digest { return digest.FromBytes(dt) }

// A release asset platform compiles only the binaries shipped there; a plan
// platform compiles every binary whatever is named.
func TestAnAssetPlatformBuildsOnlyTheBinariesShippedThere(t *testing.T) {
	p := testPlan(t, "linux/amd64")
	g := image.NewGraph(p, nil, nil)
	darwin, _ := config.ParsePlatform("darwin/arm64")
	g.Ships(darwin, "antctl")
	g.Ships(p.Platforms[0], "antctl")
	packages := func(st llb.State, step string) []string {
		t.Helper()
		def, err := st.Marshal(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, dt := range def.Def {
			var op pb.Op
			if err := op.UnmarshalVT(dt); err != nil {
				t.Fatal(err)
			}
			if e := op.GetExec(); e != nil && def.Metadata[digestOf(dt)].Description["llb.customname"] == step {
				return slices.DeleteFunc(slices.Clone(e.Meta.Args), func(a string) bool { return !strings.HasPrefix(a, "./cmd/") })
			}
		}
		t.Fatalf("no step %q", step)
		return nil
	}
	if got := packages(g.Binary("antctl", darwin), "[darwin/arm64] go build"); !slices.Equal(got, []string{"./cmd/antctl"}) {
		t.Errorf("darwin/arm64 builds %v, want ./cmd/antctl alone", got)
	}
	if got := packages(g.Binary("antctl", p.Platforms[0]), "[linux/amd64] go build"); len(got) != len(p.Binaries) {
		t.Errorf("linux/amd64, a plan platform, builds %v, want all %d binaries", got, len(p.Binaries))
	}
}

// Two platforms' go builds run side by side, each told so and given the
// CPU tokens they share; a third waits for the first.
func TestGoBuildsRunTwoSideBySide(t *testing.T) {
	waits := map[string]bool{}
	sides := map[string]string{}
	for _, s := range compileSteps(t, mustSteps(t, testPlan(t, "linux/amd64,linux/arm64,linux/arm/v7"))) {
		e := s.op.GetExec()
		if e.Meta.Args[1] != "gobuild" || strings.HasSuffix(s.name, "] standard library") {
			continue
		}
		sides[s.name] = e.Meta.Args[5] + " " + e.Meta.Args[6]
		for _, m := range e.Mounts {
			waits[s.name] = waits[s.name] || m.Dest == "/kiln/after"
		}
	}
	want := map[string]bool{"[linux/amd64] go build": false, "[linux/arm64] go build": false, "[linux/arm/v7] go build": true}
	if !maps.Equal(waits, want) {
		t.Errorf("go builds that wait for another: %v, want %v", waits, want)
	}
	for name, side := range sides {
		if side != "2 /kiln/cpus" {
			t.Errorf("%s is told SIDE CPUS %q, want 2 go builds side by side sharing /kiln/cpus", name, side)
		}
	}
	for _, s := range compileSteps(t, mustSteps(t, testPlan(t, "linux/amd64"))) {
		e := s.op.GetExec()
		if e.Meta.Args[1] != "gobuild" {
			continue
		}
		if side := e.Meta.Args[5] + " " + e.Meta.Args[6]; side != "1 -" {
			t.Errorf("a lone platform's %s is told SIDE CPUS %q, want 1 -", s.name, side)
		}
		for _, m := range e.Mounts {
			if m.Dest == "/kiln/cpus" {
				t.Errorf("a lone platform's %s mounts CPU tokens", s.name)
			}
		}
	}
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// Each platform's standard library compiles while the modules download: its
// step reads neither the modules nor anything made from them, and that
// platform's go build waits for it. Where nothing downloads (vendored, or
// the standard library only) there is no such step.
func TestStandardLibraryCompilesWhileTheModulesDownload(t *testing.T) {
	p := testPlan(t, "linux/amd64,linux/arm64")
	if len(p.Modules) == 0 {
		t.Fatal("this repository's binaries download no module; the test needs some")
	}
	all, raw := steps(t, p)
	byDigest := map[string]step{}
	for i, s := range all {
		byDigest[string(digestOf(raw[i]))] = s
	}
	var reaches func(s step, name string) bool
	reaches = func(s step, name string) bool {
		for _, in := range s.op.Inputs {
			dep := byDigest[in.Digest]
			if dep.name == name || dep.op != nil && reaches(dep, name) {
				return true
			}
		}
		return false
	}
	found := map[string]bool{}
	for _, s := range all { // every image's definition: a step may come twice
		plat, ok := strings.CutSuffix(strings.TrimPrefix(s.name, "["), "] standard library")
		if !ok {
			continue
		}
		found[plat] = true
		if reaches(s, "[go] go mod download") || reaches(s, "[go] module layer") {
			t.Errorf("%s waits for the module download", s.name)
		}
		args := s.op.GetExec().Meta.Args
		if got := args[len(args)-len(p.Std[plat]):]; !slices.Equal(got, p.Std[plat]) || !slices.Contains(p.Std[plat], "runtime") {
			t.Errorf("%s compiles %v, want the plan's %d standard packages for %s", s.name, got, len(p.Std[plat]), plat)
		}
		for _, b := range all {
			if b.name == "["+plat+"] go build" && !reaches(b, s.name) {
				t.Errorf("%s does not wait for %s", b.name, s.name)
			}
		}
	}
	if want := map[string]bool{"linux/amd64": true, "linux/arm64": true}; !maps.Equal(found, want) {
		t.Errorf("standard library steps for %v, want %v", found, want)
	}

	for name, change := range map[string]func(*plan.Plan){
		"vendored":              func(p *plan.Plan) { p.ModMode = plan.ModVendor },
		"standard library only": func(p *plan.Plan) { p.Modules = nil },
	} {
		q := *p
		change(&q)
		for _, s := range mustSteps(t, &q) {
			if strings.HasSuffix(s.name, "] standard library") {
				t.Errorf("%s: a step %s, with nothing to download beside it", name, s.name)
			}
		}
	}
}

// The standard-library step takes the go build's flags that reach the
// standard library there: not -ldflags, nor a -gcflags without a pattern,
// which go applies to the packages named on its command line.
func TestTheStandardLibraryStepTakesTheFlagsThatReachIt(t *testing.T) {
	p := testPlan(t, "linux/amd64")
	p.GoEnv.BuildArgs = append(slices.Clone(p.GoEnv.BuildArgs), "-gcflags=-N -l")
	args := map[string][]string{}
	for _, s := range mustSteps(t, p) {
		if e := s.op.GetExec(); e != nil {
			args[s.name] = e.Meta.Args
		}
	}
	build, std := args["[linux/amd64] go build"], args["[linux/amd64] standard library"]
	if !slices.Contains(build, "-gcflags=-N -l") || !slices.Contains(build, plan.NoDWARF) {
		t.Fatalf("the go build's flags: %q", build)
	}
	if !slices.Contains(std, plan.NoDWARF) || slices.Contains(std, "-gcflags=-N -l") || slices.ContainsFunc(std, func(a string) bool { return strings.HasPrefix(a, "-ldflags") }) {
		t.Errorf("the standard-library step's flags: %q; want %s, no -ldflags and no unpatterned -gcflags", std, plan.NoDWARF)
	}
}

// With kilnstep kept on the client (UseStepTool), no step builds it: the
// module layer runs it too, and a layer made before the tool was chosen
// is made again.
func TestAKeptStepToolServesEveryStep(t *testing.T) {
	p := testPlan(t, "linux/amd64")
	if len(p.Modules) == 0 {
		t.Fatal("this repository's binaries download no module; the test needs some")
	}
	g := image.NewGraph(p, nil, nil)
	g.Golang.Modules() // before the tool is chosen
	g.Golang.UseStepTool(t.TempDir())
	all, _ := graphSteps(t, g, p)
	var names []string
	for _, s := range all {
		names = append(names, s.name)
	}
	if !slices.Contains(names, "[go] module layer") || !slices.Contains(names, "[go] kilnstep") {
		t.Fatalf("steps %v: want the module layer and the kept kilnstep", names)
	}
	if slices.Contains(names, "[go] build kilnstep") {
		t.Error("a step builds kilnstep although it is kept on the client")
	}
}

// BuildKit keeps the result of a step's output only in a solve that asked
// for it: a later solve that asks for another output of the same go build
// runs the go build again. So wherever a go build of several binaries is an
// input (a binary copied out for an image or an asset, the link with
// symbols, the next platform's wait), it comes as a merge of all its
// outputs. Each state is marshaled alone, as a job of its own would.
func TestNoStepTakesOneOutputOfAGoBuild(t *testing.T) {
	p := testPlan(t, "linux/amd64,linux/arm64,linux/arm/v7") // arm/v7 waits for amd64
	g := image.NewGraph(p, nil, nil)
	checked := 0
	for _, target := range p.Platforms {
		for _, b := range p.Binaries {
			for what, st := range map[string]llb.State{"binary": g.Binary(b.Name, target), "with symbols": g.BinaryWithSymbols(b.Name, target)} {
				def, err := st.Marshal(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				ops := map[digest.Digest]*pb.Op{}
				for _, dt := range def.Def {
					var op pb.Op
					if err := op.UnmarshalVT(dt); err != nil {
						t.Fatal(err)
					}
					ops[digestOf(dt)] = &op
				}
				outputs := map[digest.Digest]int{} // go builds of several binaries: their binaries' outputs
				for dg, op := range ops {
					if e := op.GetExec(); e != nil && len(e.Meta.Args) > 1 && e.Meta.Args[1] == "gobuild" {
						n := 0
						for _, m := range e.Mounts {
							if m.Output != int64(pb.SkipOutput) && strings.HasPrefix(m.Dest, "/out/") {
								n++
							}
						}
						if n > 1 {
							outputs[dg] = n
						}
					}
				}
				for dg, op := range ops {
					asked := map[digest.Digest]map[int64]bool{}
					for _, in := range op.Inputs {
						if _, ok := outputs[digest.Digest(in.Digest)]; ok {
							if asked[digest.Digest(in.Digest)] == nil {
								asked[digest.Digest(in.Digest)] = map[int64]bool{}
							}
							asked[digest.Digest(in.Digest)][in.Index] = true
						}
					}
					for step, idx := range asked {
						checked++
						name := def.Metadata[step].Description["llb.customname"]
						if op.GetMerge() == nil || len(idx) != outputs[step] {
							t.Errorf("%s %s: %s (%s) takes outputs %v of %s, which has %d: a later solve would run it again", b.Name, target.Architecture+target.Variant, def.Metadata[dg].Description["llb.customname"], what, slices.Sorted(maps.Keys(idx)), name, outputs[step])
						}
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no step took a go build of several binaries as an input: the test checks nothing")
	}
}
