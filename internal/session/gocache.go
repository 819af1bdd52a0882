package session

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/exporter/containerimage/exptypes"
	gateway "github.com/moby/buildkit/frontend/gateway/client"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/gocache"
	"github.com/kiln-build/kiln/internal/golang"
)

// seedGoCache makes the package steps seed GOCACHE from the best snapshot
// in repo, in a Go cache of this snapshot's own, never the shared one: an
// entry a snapshot planted cannot outlive the snapshot.
func (s *Session) seedGoCache(ctx context.Context, repo string, cacheDir string, targets []string) {
	snap := gocache.Seed(ctx, repo, s.Plan, targets, cacheDir, s.goCacheMax, s.goCacheKey)
	if snap == nil {
		return
	}
	s.Plan.Cache.GoCache = gocache.SeededCacheID(s.Plan.Cache.GoCache, snap.Digest)
	s.locals[golang.LocalGoCacheSnapshot] = snap.Dir
	s.Golang.Seed(snap.Dir, snap.Digest)
}

// publishGoCache pushes the GOCACHE entries of this build's packages.
func (s *Session) publishGoCache(ctx context.Context, repo string, max int64) (*gocache.Result, error) {
	if max == 0 {
		max = gocache.DefaultMax
	}
	st := s.Golang.Snapshot(s.Plan.Binaries, s.Plan.Platforms, max)
	push := func(ctx context.Context, name string, st llb.State, refs []string, exportCache bool) (string, error) {
		opts := s.solveOptions(ctx)
		if !exportCache {
			opts.CacheExports = nil
		}
		out, err := s.daemon.Solve(ctx, []buildkit.Job{s.pushJob(name, st, refs)}, opts)
		if err != nil {
			return "", err
		}
		return out.Results[0].Digest, nil
	}
	return gocache.Publish(ctx, repo, s.Plan, st, s.signingKey, push)
}

// SolveImages solves image jobs, then, when a layer cache is to be
// exported, exports it once for all images from one job ("images"). Per-job
// exports held the steps the images share (antctl, the package steps) under
// several refs, and a daemon importing them all then reran some of those
// steps now and then.
func (s *Session) SolveImages(ctx context.Context, jobs []buildkit.Job) (*buildkit.Outcome, error) {
	return s.solveImages(ctx, jobs, nil)
}

// solveImages is SolveImages with check judging the tarballs before they
// replace the ones in place (buildkit.SolveOptions.Check).
func (s *Session) solveImages(ctx context.Context, jobs []buildkit.Job, check func([]buildkit.Result, map[string]string) error) (*buildkit.Outcome, error) {
	opts := s.solveOptions(ctx)
	opts.CacheExports = nil
	opts.Check = check
	out, err := s.daemon.Solve(ctx, jobs, opts)
	if err != nil || len(s.cacheTo) == 0 {
		return out, err
	}
	cacheJob := buildkit.Job{
		Name: "images",
		Build: func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
			all := gateway.NewResult()
			var exp exptypes.Platforms
			for _, img := range s.Plan.Images {
				res, err := s.Build(img)(ctx, c)
				if err != nil {
					return nil, err
				}
				for _, target := range img.Targets {
					id := img.Name + "/" + config.FormatPlatform(target)
					all.AddRef(id, res.Refs[config.FormatPlatform(target)])
					exp.Platforms = append(exp.Platforms, exptypes.Platform{ID: id, Platform: target})
				}
			}
			dt, err := json.Marshal(exp)
			if err != nil {
				return nil, err
			}
			all.AddMeta(exptypes.ExporterPlatformsKey, dt)
			return all, nil
		},
		FrontendAttrs: map[string]string{"platform": strings.Join(s.Plan.PlatformIDs(), ",")},
	}
	cached, err := s.daemon.Solve(ctx, []buildkit.Job{cacheJob}, s.solveOptions(ctx))
	if err != nil {
		return nil, fmt.Errorf("export the layer cache: %w", err)
	}
	out.Steps = mergeSteps(out.Steps, cached.Steps)
	return out, nil
}

// mergeSteps adds the steps of a later solve that the first did not report.
func mergeSteps(first, later buildkit.Steps) buildkit.Steps {
	seen := map[string]bool{}
	for _, st := range first {
		seen[st.Name] = true
	}
	for _, st := range later {
		if !seen[st.Name] {
			first = append(first, st)
		}
	}
	return first
}

// pushJob solves one state and pushes it as a single-platform image under refs.
func (s *Session) pushJob(name string, st llb.State, refs []string) buildkit.Job {
	attrs := s.ExporterAttrs(strings.Join(refs, ","), false)
	attrs["push"] = "true"
	return buildkit.Job{
		Name: name,
		Build: func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
			def, err := st.Marshal(ctx)
			if err != nil {
				return nil, err
			}
			return c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB()})
		},
		Export: client.ExportEntry{Type: client.ExporterImage, Attrs: attrs},
	}
}
