package build

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/log"
	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/client/llb"
	gateway "github.com/moby/buildkit/frontend/gateway/client"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/golang"
)

// useKeptStepTool makes the build send kilnstep from the client's cache
// (<cache>/kilnstep/<key>) instead of building it before every go build of
// an empty daemon. The first build on a machine builds it in a solve of its
// own, with the pinned toolchain, and keeps it there, as the toolchain is
// kept. A release builds it from source with everything else.
func (s *Session) useKeptStepTool(ctx context.Context, cache string) error {
	key := golang.StepToolKey(s.Plan.Toolchain, s.Plan.BuildPlatform)
	dir := filepath.Join(cache, "kilnstep", key)
	if !keptStepTool(dir) {
		log.G(ctx).Warnf("first run: building kilnstep, kiln's step tool, for %s (once per kiln version; about 10 s)", config.FormatPlatform(s.Plan.BuildPlatform))
		if err := s.buildStepTool(ctx, dir); err != nil {
			return err
		}
	}
	s.locals[golang.LocalStepTool] = dir
	s.Golang.UseStepTool(dir)
	return nil
}

// buildStepTool solves the kilnstep build alone and moves its output to
// dir, whole or not at all. A dir another build made meanwhile stays: it
// holds the same bytes, and that build may be sending it.
func (s *Session) buildStepTool(ctx context.Context, dir string) error {
	st := s.Golang.BuildStepTool()
	staged := fmt.Sprintf("%s.new-%d", dir, os.Getpid())
	job := buildkit.Job{
		Name: "kilnstep",
		Build: func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
			def, err := st.Marshal(ctx, llb.Platform(s.Plan.BuildPlatform))
			if err != nil {
				return nil, err
			}
			return c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB(), CacheImports: buildkit.CacheImports(c)})
		},
		Export: client.ExportEntry{Type: client.ExporterLocal},
		Dest:   staged,
	}
	opts := s.solveOptions(ctx)
	opts.CacheExports = nil
	if _, err := s.daemon.Solve(ctx, []buildkit.Job{job}, opts); err != nil {
		return fmt.Errorf("build kilnstep: %w", err)
	}
	defer os.RemoveAll(staged)
	if fi, err := os.Lstat(filepath.Join(staged, golang.StepToolFile)); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("build kilnstep: its output %s holds no %s", staged, golang.StepToolFile)
	}
	if err := os.Rename(staged, dir); err != nil && !keptStepTool(dir) {
		if err := os.RemoveAll(dir); err != nil { // not a usable tool: a planted or broken entry
			return fmt.Errorf("build kilnstep: remove %s: %w", dir, err)
		}
		if err := os.Rename(staged, dir); err != nil {
			return fmt.Errorf("build kilnstep: %w", err)
		}
	}
	return nil
}

// keptStepTool reports whether dir holds a kilnstep as buildStepTool leaves
// it: a regular file, not a link to one elsewhere.
func keptStepTool(dir string) bool {
	fi, err := os.Lstat(filepath.Join(dir, golang.StepToolFile))
	return err == nil && fi.Mode().IsRegular()
}
