package session

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/log"
	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/client/llb"
	gateway "github.com/moby/buildkit/frontend/gateway/client"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/uptodate"
)

// useKeptStepTool makes the build send kilnstep from the client's cache
// (<cache>/kilnstep/<key>) instead of building it before every go build of
// an empty daemon. The first build on a machine builds it in a solve of its
// own, with the pinned toolchain, and keeps it there, as the toolchain is
// kept. A release builds it from source with everything else.
func (s *Session) useKeptStepTool(ctx context.Context, cache string) error {
	key, err := s.Golang.StepToolKey(ctx)
	if err != nil {
		return err
	}
	dir := filepath.Join(cache, "kilnstep", key)
	if !keptStepTool(dir) {
		log.G(ctx).Warnf("first run: building kilnstep, kiln's step tool, for %s (once per kiln version; 10-20 s)", config.FormatPlatform(s.Plan.BuildPlatform))
		if err := s.buildStepTool(ctx, dir); err != nil {
			return err
		}
	}
	s.locals[golang.LocalStepTool] = dir
	s.Golang.UseStepTool(dir)
	return nil
}

// LayOutTools solves the steps that lay out the tools (golang's
// ToolStates) alone, exporting nothing: the bench's cold build starts with
// them in the daemon, as native's starts with Go installed.
func (s *Session) LayOutTools(ctx context.Context) error {
	var jobs []buildkit.Job
	for i, st := range s.Golang.ToolStates() {
		jobs = append(jobs, buildkit.Job{
			Name: fmt.Sprintf("tool %d", i+1),
			Build: func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
				def, err := st.Marshal(ctx, llb.Platform(s.Plan.BuildPlatform))
				if err != nil {
					return nil, err
				}
				return c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB(), Evaluate: true})
			},
		})
	}
	opts := s.solveOptions(ctx)
	opts.CacheExports, opts.CacheImports = nil, nil
	if _, err := s.daemon.Solve(ctx, jobs, opts); err != nil {
		return fmt.Errorf("lay out the tools: %w", err)
	}
	return nil
}

// buildStepTool solves the kilnstep build alone and moves its output to
// dir, whole or not at all. A usable dir another build made meanwhile
// stays: it holds the same bytes, and that build may be sending it.
func (s *Session) buildStepTool(ctx context.Context, dir string) error {
	st := s.Golang.BuildStepTool()
	staged := dir + ".new" // Solve writes beside it first, and sweeps what a killed run left
	job := buildkit.Job{
		Name: "kilnstep",
		Build: func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
			def, err := st.Marshal(ctx, llb.Platform(s.Plan.BuildPlatform))
			if err != nil {
				return nil, err
			}
			// No layer cache: what is kept here runs in every later
			// build, so it is made from its source alone.
			return c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB()})
		},
		Export: client.ExportEntry{Type: client.ExporterLocal},
		Dest:   staged,
	}
	opts := s.solveOptions(ctx)
	opts.CacheExports, opts.CacheImports = nil, nil
	if _, err := s.daemon.Solve(ctx, []buildkit.Job{job}, opts); err != nil {
		return fmt.Errorf("build kilnstep: %w", err)
	}
	defer os.RemoveAll(staged)
	sum, err := uptodate.FileSHA256(filepath.Join(staged, golang.StepToolFile))
	if err != nil {
		return fmt.Errorf("build kilnstep: its output %s holds no executable %s", staged, golang.StepToolFile)
	}
	if err := os.WriteFile(filepath.Join(staged, stepToolSum), []byte(sum+"\n"), 0o644); err != nil {
		return fmt.Errorf("build kilnstep: %w", err)
	}
	if !keptStepTool(staged) {
		return fmt.Errorf("build kilnstep: its output %s holds no executable %s", staged, golang.StepToolFile)
	}
	if os.Rename(staged, dir) == nil || keptStepTool(dir) {
		return nil
	}
	// A broken or planted entry: set aside under a name of this process's
	// own, so that a usable one another build puts in place is never removed.
	aside := fmt.Sprintf("%s.broken-%d", dir, os.Getpid())
	if err := os.Rename(dir, aside); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("build kilnstep: move the unusable %s aside: %w", dir, err)
	}
	defer os.RemoveAll(aside)
	if err := os.Rename(staged, dir); err != nil && !keptStepTool(dir) {
		return fmt.Errorf("build kilnstep: %w", err)
	}
	return nil
}

// stepToolSum names the record of the kept kilnstep's sha256, beside it.
const stepToolSum = "kilnstep.sha256"

// keptStepTool reports whether dir holds a kilnstep as buildStepTool leaves
// it: a folder (not a link to one elsewhere) with an executable, non-empty
// plain file whose bytes are those recorded when it was built. It is read
// before every build that sends it.
func keptStepTool(dir string) bool {
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return false
	}
	tool := filepath.Join(dir, golang.StepToolFile)
	fi, err := os.Lstat(tool)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o100 == 0 || fi.Size() == 0 {
		return false
	}
	want, err := os.ReadFile(filepath.Join(dir, stepToolSum))
	if err != nil {
		return false
	}
	got, err := uptodate.FileSHA256(tool)
	return err == nil && strings.TrimSpace(string(want)) == got
}
