package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/log"
	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/exporter/containerimage/exptypes"
	gateway "github.com/moby/buildkit/frontend/gateway/client"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/gocache"
	"github.com/kiln-build/kiln/internal/golang"
)

// GoCacheResult is a published Go cache snapshot.
type GoCacheResult struct {
	Refs   []string `json:"refs"`
	Digest string   `json:"digest"`
	// Signed is true when a signature was pushed beside it (<tag>.sig).
	Signed bool `json:"signed"`
}

// goCacheRepo checks a snapshot repository (HOST[:PORT]/path) and says
// whether it is reached over plain HTTP.
func goCacheRepo(repo, flag string) (string, bool, error) {
	repo = strings.TrimSuffix(repo, "/")
	if !strings.Contains(repo, "/") {
		return "", false, fmt.Errorf("%s=%s: give a repository, HOST[:PORT]/path (e.g. %s/antrea/gocache)", flag, repo, repo)
	}
	r, plainHTTP, err := buildkit.RegistryHost(repo)
	if err != nil {
		return "", false, fmt.Errorf("%s: %w", flag, err)
	}
	return r, plainHTTP, nil
}

// seedGoCache fetches the best snapshot for this build and makes the
// package steps seed GOCACHE from it. Any failure is a warning: the build
// goes on without the snapshot.
func (s *Session) seedGoCache(ctx context.Context, repo string, cacheDir string) {
	repo, plainHTTP, err := goCacheRepo(repo, "-gocachefrom")
	if err != nil {
		log.G(ctx).Warnf("Go cache snapshot: %v; building without it", err)
		return
	}
	snap, err := gocache.Fetch(ctx, repo, gocache.Tags(s.Plan), cacheDir, gocache.FetchOptions{PlainHTTP: plainHTTP, Credentials: buildkit.Credentials(), Max: s.goCacheMax, PublicKey: s.goCacheKey})
	switch {
	case errors.Is(err, gocache.ErrNotFound):
		log.G(ctx).Infof("Go cache snapshot: none in %s for this toolchain and Go environment yet", repo)
		return
	case err != nil:
		log.G(ctx).Warnf("Go cache snapshot rejected: %v; building without it (slower, never wrong)", err)
		return
	}
	log.G(ctx).Infof("Go cache snapshot %s (%s): %d entries, %d MiB", snap.Ref, snap.Digest, snap.Entries, snap.Bytes>>20)
	// The entries go into a Go cache of this snapshot's own, never the
	// shared one: an entry a snapshot planted cannot outlive the snapshot.
	s.Plan.Cache.GoCache = SeededCacheID(s.Plan.Cache.GoCache, snap.Digest)
	s.locals[golang.LocalGoCacheSnapshot] = snap.Dir
	s.Golang.Seed(snap.Dir, snap.Digest)
}

// publishGoCache pushes the GOCACHE entries of this build's packages as a
// one-layer image tagged with gocache.Tags.
func (s *Session) publishGoCache(ctx context.Context, repo string, max int64) (*GoCacheResult, error) {
	repo, plainHTTP, err := goCacheRepo(repo, "-gocacheto")
	if err != nil {
		return nil, err
	}
	if max == 0 {
		max = gocache.DefaultMax
	}
	var refs []string
	for _, tag := range gocache.Tags(s.Plan) {
		refs = append(refs, repo+":"+tag)
	}
	st := s.Golang.Snapshot(s.Plan.Binaries, s.Plan.Platforms, max)
	out, err := s.daemon.Solve(ctx, []buildkit.Job{s.pushJob("gocache", st, refs)}, s.solveOptions(ctx))
	if err != nil {
		return nil, fmt.Errorf("publish the Go cache snapshot to %s: %w", repo, err)
	}
	res := &GoCacheResult{Refs: refs, Digest: out.Results[0].Digest}
	if s.signingKey != nil {
		if err := s.signGoCache(ctx, refs, plainHTTP); err != nil {
			return nil, err
		}
		res.Signed = true
	}
	return res, nil
}

// signGoCache signs the layer of a pushed snapshot and pushes the signature
// as a one-file image under <tag>.sig of each of its tags.
func (s *Session) signGoCache(ctx context.Context, refs []string, plainHTTP bool) error {
	layer, err := gocache.LayerDigest(ctx, refs[0], gocache.FetchOptions{PlainHTTP: plainHTTP, Credentials: buildkit.Credentials()})
	if err != nil {
		return fmt.Errorf("sign the Go cache snapshot %s: %w", refs[0], err)
	}
	var sigRefs []string
	for _, ref := range refs {
		sigRefs = append(sigRefs, ref+".sig")
	}
	st := llb.Scratch().File(llb.Mkfile("/"+gocache.SignatureFile, 0o644, gocache.Sign(s.signingKey, layer), llb.WithCreatedTime(s.Plan.Created())),
		llb.WithCustomName("[go cache] snapshot signature"))
	opts := s.solveOptions(ctx)
	opts.CacheExports = nil
	if _, err := s.daemon.Solve(ctx, []buildkit.Job{s.pushJob("gocache-signature", st, sigRefs)}, opts); err != nil {
		return fmt.Errorf("push the Go cache snapshot signature: %w", err)
	}
	return nil
}

// solveImages solves image jobs, then, when a layer cache is to be
// exported, exports it once for all images from one job ("images"). Per-job
// exports held the steps the images share (antctl, the package steps) under
// several refs, and a daemon importing them all then reran some of those
// steps now and then.
func (s *Session) SolveImages(ctx context.Context, jobs []buildkit.Job) (*buildkit.Outcome, error) {
	opts := s.solveOptions(ctx)
	opts.CacheExports = nil
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

// SeededCacheID is the Go cache mount a build seeded from a snapshot uses.
func SeededCacheID(shared, snapshotDigest string) string {
	_, hex, _ := strings.Cut(snapshotDigest, ":")
	if len(hex) > 12 {
		hex = hex[:12]
	}
	return shared + "-seed-" + hex
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
