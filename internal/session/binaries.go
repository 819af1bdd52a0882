package session

import (
	"context"
	"path/filepath"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/buildkit/export"
	"github.com/kiln-build/kiln/internal/gocache"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/uptodate"
)

// BinariesOutcome is where Binaries wrote and which steps ran.
type BinariesOutcome struct {
	Dir string
	// Kept is true when the binaries written before were made from the same
	// inputs, so nothing was built.
	Kept bool
	buildkit.Steps
	// Sent are the files the daemon sent, the binaries whose bytes changed;
	// the others were kept from the last build.
	Sent []string
	// GoCache is the Go cache snapshot published, when asked for.
	GoCache *gocache.Result
}

// Binaries builds every configured binary for every platform and writes
// them to <out>/bin/<os>_<arch>/<name>.
func Binaries(ctx context.Context, opts Options) (*BinariesOutcome, error) {
	head := headOf(opts)
	if r, _, ok := noopOutcome(opts, "binaries", head); ok {
		return &BinariesOutcome{Dir: r.Dir, Kept: true, Steps: r.steps()}, nil
	}
	s, noopInputs, err := startRecording(ctx, opts, "binaries", head)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	defer noopInputs.wait()
	var files []export.FileCopy
	var links, built, written []string
	dest := filepath.Join(opts.OutDirFor(s.Plan.Root), "bin")
	for _, target := range s.Plan.Platforms {
		for _, b := range s.Plan.Binaries {
			// Straight from the go build's output of this binary: a step
			// per binary that copies it out first would only add a round
			// trip per file.
			step, path := s.Linked(b.Name, target)
			to := golang.BinaryPath(b, target)
			files = append(files, export.FileCopy{From: step, Src: path, Dest: to})
			links = append(links, golang.LinkStepName(b.Name, target))
			written = append(written, filepath.Join(dest, to))
		}
		built = append(built, golang.PackageStepName(target))
	}
	inputs, err := s.inputs(opts.OutDirFor(s.Plan.Root))
	if err != nil {
		return nil, err
	}
	done := readOutputs(opts.OutDirFor(s.Plan.Root))
	key, _ := uptodate.OutputKey("binaries", dest, inputs, links, written...)
	out := &BinariesOutcome{Dir: dest}
	recorded := noopResult{Dir: dest, Steps: built}
	if r, ok := done.Current("binaries", key); ok && s.mayReuse(opts) {
		s.sawOutputs(r)
		out.Kept, out.Steps = true, recorded.steps()
		s.saveSourceHashes()
		s.recordNoop(noopInputs, written, recorded)
		return out, nil
	}
	s.beforeSolve()
	if out.Steps, out.Sent, err = s.ExportFiles(ctx, "binaries", files, dest, done.Written("binaries")); err != nil {
		return nil, err
	}
	s.afterSolve()
	s.sawOutputs(done.Set("binaries", s.recordable(key), "", written))
	if err := done.Write(); err != nil {
		return nil, err
	}
	s.saveSourceHashes()
	if s.goCacheTo != "" {
		if out.GoCache, err = s.publishGoCache(ctx, s.goCacheTo, s.goCacheMax); err != nil {
			return nil, err
		}
	}
	s.recordNoop(noopInputs, written, recorded)
	return out, nil
}

// ExportFiles solves the files and writes them into one directory at dest
// (buildkit.Daemon.ExportFiles); written is how kiln last wrote dest's
// files, from the up-to-date record (nil for none).
func (s *Session) ExportFiles(ctx context.Context, name string, files []export.FileCopy, dest string, written map[string]uptodate.Stat) (steps buildkit.Steps, sent []string, err error) {
	asWritten := func(path string) (int64, int64, bool) {
		was, ok := written[path]
		now, exists := uptodate.StatFile(path)
		// Times in whole seconds (a layer from a registry cache keeps no
		// more) or no change time cannot tell one link's binary from another's.
		if !ok || !exists || now != was || was.Change == 0 || was.ModTime%1e9 == 0 {
			return 0, 0, false
		}
		return was.Size, was.ModTime, true
	}
	opts := s.solveOptions(ctx)
	return export.Files(ctx, s.daemon, name, files, dest, asWritten, opts)
}
