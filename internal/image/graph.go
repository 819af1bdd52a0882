package image

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/client/llb/sourceresolver"
	"github.com/moby/buildkit/exporter/containerimage/exptypes"
	gateway "github.com/moby/buildkit/frontend/gateway/client"
	"github.com/moby/buildkit/solver/pb"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/plan"
)

// graph is the LLB graph of a plan: compile steps shared by every image
// that carries the binary, and one root filesystem per image and platform.
type Graph struct {
	Plan   *plan.Plan
	Golang *golang.Graph
	// NoCache re-runs every vertex once (reproducibility checks): a vertex
	// is marshalled with IgnoreCache until a solve of this graph has run it,
	// so images sharing a go build do not each compile it again.
	NoCache bool

	mu       sync.Mutex
	binaries map[string]llb.State    // by "name platform symbols"
	built    map[string]golang.Built // by platform
	shipped  map[string][]string     // binaries of a platform outside the plan's, by platform
	extra    []ocispec.Platform      // platforms outside the plan's, in the order asked for
	reran    map[digest.Digest]bool  // vertices a NoCache solve of this graph ran
}

func NewGraph(p *plan.Plan, excludes []string, fetch *golang.Fetch) *Graph {
	return NewGraphFrom(p, golang.Context(p.Root, excludes), golang.Toolchain(p.Toolchain), excludes, fetch)
}

// newGraphFrom builds a graph on given context and toolchain sources.
func NewGraphFrom(p *plan.Plan, context, toolchain llb.State, excludes []string, fetch *golang.Fetch) *Graph {
	return &Graph{
		Plan:     p,
		Golang:   golang.NewGraph(p, context, toolchain, excludes, fetch),
		binaries: map[string]llb.State{},
		built:    map[string]golang.Built{},
		shipped:  map[string][]string{},
	}
}

// Ships names the only binaries built for a platform outside the plan's,
// such as a release asset platform: antctl alone ships for darwin, so its go
// build there compiles no other binary. A plan platform builds every binary
// whatever is named. Call it before the platform's first Binary.
func (s *Graph) Ships(target ocispec.Platform, names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	platform := config.FormatPlatform(target)
	if _, built := s.built[platform]; built {
		panic(fmt.Sprintf("Ships(%s) after that platform's first Binary", platform))
	}
	for _, n := range names {
		if !slices.Contains(s.shipped[platform], n) {
			s.shipped[platform] = append(s.shipped[platform], n)
		}
	}
}

// binary returns the compile step of one binary for one platform, once.
func (s *Graph) Binary(name string, target ocispec.Platform) llb.State {
	return s.link(name, target, false)
}

// Linked is one binary for one platform where its go build step leaves
// it: the step's output of that binary alone, and the file's path in it
// (golang.BinaryPath). Unlike Binary's copy, BuildKit keys nothing on the
// binary alone here, so it suits a file that is only exported, not a layer.
func (s *Graph) Linked(name string, target ocispec.Platform) (llb.State, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out, ok := s.builtFor(target).Outputs[name]
	if !ok {
		panic(fmt.Sprintf("binary %s is not built for %s", name, config.FormatPlatform(target)))
	}
	return out, golang.BinaryPath(*s.Plan.Binary(name), target)
}

// binaryWithSymbols is binary keeping the symbol table, for size reports.
func (s *Graph) BinaryWithSymbols(name string, target ocispec.Platform) llb.State {
	return s.link(name, target, true)
}

func (s *Graph) link(name string, target ocispec.Platform, symbols bool) llb.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	platform := config.FormatPlatform(target)
	key := fmt.Sprintf("%s %s %t", name, platform, symbols)
	if st, ok := s.binaries[key]; ok {
		return st
	}
	built := s.builtFor(target)
	st, ok := built.Binaries[name]
	if !ok {
		panic(fmt.Sprintf("binary %s is not built for %s: Ships names the binaries of a platform outside the plan before its first Binary", name, platform))
	}
	if symbols {
		st = s.Golang.LinkWithSymbols(*s.Plan.Binary(name), built.Steps[name], target)
	}
	s.binaries[key] = st
	return st
}

// builtFor is the go build of a platform. The plan's platforms come first,
// in plan order, then platforms outside the plan (release assets) in the
// order asked for; each waits for the one golang.SideBySide places before
// it, so that no more run at once. The caller holds s.mu.
func (s *Graph) builtFor(target ocispec.Platform) golang.Built {
	platform := config.FormatPlatform(target)
	if b, ok := s.built[platform]; ok {
		return b
	}
	order := slices.Clone(s.Plan.Platforms)
	inPlan := slices.ContainsFunc(order, func(t ocispec.Platform) bool { return config.FormatPlatform(t) == platform })
	if !inPlan && !slices.ContainsFunc(s.extra, func(t ocispec.Platform) bool { return config.FormatPlatform(t) == platform }) {
		s.extra = append(s.extra, target)
	}
	order = append(order, s.extra...)
	// A plan of one platform builds at full width, so anything after it
	// (a release asset platform) waits its turn.
	side := min(golang.SideBySide, len(s.Plan.Platforms))
	var after *llb.State
	if i := slices.IndexFunc(order, func(t ocispec.Platform) bool { return config.FormatPlatform(t) == platform }); i >= max(side, 1) {
		prev := s.builtFor(order[i-max(side, 1)]).Step
		after = &prev
	}
	side = max(side, 1)
	bins := s.Plan.Binaries
	if names, ok := s.shipped[platform]; ok && !inPlan {
		bins = slices.DeleteFunc(slices.Clone(bins), func(b plan.Binary) bool { return !slices.Contains(names, b.Name) })
	}
	b := s.Golang.BuildBinaries(bins, target, side, after)
	s.built[platform] = b
	return b
}

// imageStates returns each platform's root filesystem of one image, in plan order.
func (s *Graph) States(img plan.Image) []llb.State {
	states := make([]llb.State, len(img.Targets))
	for i, target := range img.Targets {
		bins := map[string]llb.State{}
		for _, b := range img.Binaries {
			bins[b] = s.Binary(b, target)
		}
		states[i] = Rootfs(img, target, bins, s.Golang.Context, s.Plan.Created())
	}
	return states
}

// imageBuild is the gateway build of one multi-platform image: one ref per
// platform plus the platforms metadata, as the Dockerfile frontend returns.
func (s *Graph) Build(img plan.Image) gateway.BuildFunc {
	states := s.States(img)
	return func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
		// Every platform is marshalled before any is solved: under NoCache
		// a vertex this job has not run yet must still ignore the cache.
		defs := make([]*llb.Definition, len(img.Targets))
		for i := range img.Targets {
			def, err := s.Marshal(ctx, states[i])
			if err != nil {
				return nil, err
			}
			defs[i] = def
		}
		// The platforms are solved one at a time. A solve is lazy: the
		// exporter runs the steps, side by side. An isolated build runs
		// them now instead, so every platform's in one solve first:
		// BuildKit was seen to release a step's result twice when solves
		// sharing steps ran at once in one job, and a later step found that
		// mount empty.
		if s.NoCache && len(states) > 1 {
			def, err := s.Marshal(ctx, buildkit.Together(fmt.Sprintf("[%s] wait for every platform", img.Name), states...))
			if err != nil {
				return nil, err
			}
			if _, err := c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB(), CacheImports: buildkit.CacheImports(c), Evaluate: true}); err != nil {
				return nil, err
			}
			defs = append(defs, def)
		}
		res := gateway.NewResult()
		for i, target := range img.Targets {
			id := config.FormatPlatform(target)
			base, err := baseConfig(ctx, c, img, target)
			if err != nil {
				return nil, err
			}
			// An isolated build runs its steps now, so a later job finds
			// their results; the next job starts after this one's export.
			r, err := c.Solve(ctx, gateway.SolveRequest{Definition: defs[i].ToPB(), CacheImports: buildkit.CacheImports(c), Evaluate: s.NoCache})
			if err != nil {
				return nil, err
			}
			ref, err := r.SingleRef()
			if err != nil {
				return nil, err
			}
			cfg, err := json.Marshal(Config(s.Plan, img, target, base))
			if err != nil {
				return nil, err
			}
			res.AddRef(id, ref)
			res.AddMeta(exptypes.ExporterImageConfigKey+"/"+id, cfg)
			if base != nil {
				// The exporter then leaves the base's layers as they are
				// when it rewrites layer times.
				raw, err := json.Marshal(base)
				if err != nil {
					return nil, err
				}
				res.AddMeta(exptypes.ExporterImageBaseConfigKey+"/"+id, raw)
			}
		}
		for _, def := range defs {
			s.Solved(def)
		}
		exp := exptypes.Platforms{}
		for _, target := range img.Targets {
			exp.Platforms = append(exp.Platforms, exptypes.Platform{ID: config.FormatPlatform(target), Platform: target})
		}
		dt, err := json.Marshal(exp)
		if err != nil {
			return nil, err
		}
		res.AddMeta(exptypes.ExporterPlatformsKey, dt)
		return res, nil
	}
}

// Marshal is st's definition; under NoCache every vertex no earlier job
// of this graph ran ignores the cache, and one that ran is taken from it:
// the result it left is the newest under its key. That holds because jobs
// run one after another (buildkit.Daemon.Solve).
func (s *Graph) Marshal(ctx context.Context, st llb.State) (*llb.Definition, error) {
	if !s.NoCache {
		return st.Marshal(ctx)
	}
	def, err := st.Marshal(ctx, llb.IgnoreCache)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for dg, meta := range def.Metadata {
		if s.reran[dg] {
			meta.IgnoreCache = false
			def.Metadata[dg] = meta
		}
	}
	return def, nil
}

// Solved records the vertices of a definition a NoCache solve has run.
func (s *Graph) Solved(def *llb.Definition) {
	if !s.NoCache {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reran == nil {
		s.reran = map[digest.Digest]bool{}
	}
	for dg := range def.Metadata {
		s.reran[dg] = true
	}
}

// ExporterAttrs make the export reproducible: the source date, OCI media
// types. An image on scratch needs no layer time rewrite (Rootfs dates every
// entry); one on a base gets its layer rewritten, the base's left alone.
func (s *Graph) ExporterAttrs(name string, onBase bool) map[string]string {
	attrs := map[string]string{
		"name":                          name,
		string(exptypes.OptKeyOCITypes): "true",
		"source-date-epoch":             strconv.FormatInt(s.Plan.SourceDateEpoch, 10),
	}
	if onBase {
		attrs[string(exptypes.OptKeyRewriteTimestamp)] = "true"
	}
	return attrs
}

// Definitions returns, for each named vertex of every image, what its
// definition is made of: "step definition" is the digest of the vertex with
// all it depends on, and "definition of NAME" the digest of each named vertex
// of that chain (itself included) with its inputs left out, so explain can
// name the vertex whose own definition changed rather than every one after it.
func (g *Graph) Definitions() (map[string]map[string]string, error) {
	defs := map[string]map[string]string{}
	for _, img := range g.Plan.Images {
		for _, st := range g.States(img) {
			def, err := st.Marshal(context.Background())
			if err != nil {
				return nil, err
			}
			ops := map[digest.Digest]*pb.Op{}
			for _, dt := range def.Def {
				var op pb.Op
				if err := op.UnmarshalVT(dt); err != nil {
					return nil, err
				}
				ops[digest.FromBytes(dt)] = &op
			}
			name := func(dg digest.Digest) string { return def.Metadata[dg].Description["llb.customname"] }
			for dg := range ops {
				if name(dg) == "" {
					continue
				}
				parts := map[string]string{"step definition": dg.Encoded()[:12]}
				seen := map[digest.Digest]bool{}
				var walk func(digest.Digest)
				walk = func(d digest.Digest) {
					if seen[d] || ops[d] == nil {
						return
					}
					seen[d] = true
					if n := name(d); n != "" {
						parts["definition of "+n] = ownDigest(ops[d])
					}
					for _, in := range ops[d].Inputs {
						walk(digest.Digest(in.Digest))
					}
				}
				walk(dg)
				defs[name(dg)] = parts
			}
		}
	}
	return defs, nil
}

// ownDigest is the digest of an op without its inputs' digests.
func ownDigest(op *pb.Op) string {
	own := op.CloneVT()
	for _, in := range own.Inputs {
		in.Digest = ""
	}
	// Map fields (a source's attributes) marshal in random order otherwise.
	dt, _ := proto.MarshalOptions{Deterministic: true}.Marshal(own) // it was just unmarshaled
	return digest.FromBytes(dt).Encoded()[:12]
}

// baseConfig reads the base image's config for the platform; nil on scratch.
func baseConfig(ctx context.Context, c gateway.Client, img plan.Image, target ocispec.Platform) (*ocispec.Image, error) {
	ref := img.BaseFor(target)
	if ref == "" {
		return nil, nil
	}
	_, _, dt, err := c.ResolveImageConfig(ctx, ref, sourceresolver.Opt{ImageOpt: &sourceresolver.ResolveImageOpt{Platform: &target}})
	if err != nil {
		return nil, fmt.Errorf("%s/%s: base %s for %s: %w; check that the registry is reachable with your Docker credentials and that the base has this platform (or narrow the image's platforms)",
			img.Dir, config.ImageYAML, ref, config.FormatPlatform(target), err)
	}
	var base ocispec.Image
	if err := json.Unmarshal(dt, &base); err != nil {
		return nil, fmt.Errorf("base %s for %s: config: %w", ref, config.FormatPlatform(target), err)
	}
	if base.OS != target.OS || base.Architecture != target.Architecture {
		return nil, fmt.Errorf("%s/%s: base %s has no %s image (it gave %s/%s); narrow the image's platforms or pick a base that has it",
			img.Dir, config.ImageYAML, ref, config.FormatPlatform(target), base.OS, base.Architecture)
	}
	return &base, nil
}
