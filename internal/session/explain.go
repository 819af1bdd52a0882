package session

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/explain"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/uptodate"
)

const (
	explainDir = "explain"
	lastBuild  = "last.json"
	priorBuild = "previous.json"
)

// readOutputs is the up-to-date record of the outputs under outDir.
func readOutputs(outDir string) *uptodate.Outputs {
	return uptodate.ReadOutputs(filepath.Join(outDir, explainDir, uptodate.OutputsFile))
}

// sourceHashesPath is the source digests' record of the outputs under outDir.
func sourceHashesPath(outDir string) string {
	return filepath.Join(outDir, explainDir, uptodate.SourceHashesFile)
}

// record keeps this build's step inputs and outcomes for `mage explain`,
// moving the last record aside as the previous one.
func record(opts Options, p *plan.Plan, inputs explain.Inputs, steps buildkit.Steps) ([]explain.Explanation, error) {
	dir := filepath.Join(opts.OutDirFor(p.Root), explainDir)
	prev, err := readRecord(filepath.Join(dir, lastBuild))
	if err != nil {
		return nil, err
	}
	now := explain.Record{Inputs: inputs, Steps: steps}
	if err := os.Remove(filepath.Join(dir, noopMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if prev != nil {
		// Another build running at the same time may have moved it already.
		if err := os.Rename(filepath.Join(dir, lastBuild), filepath.Join(dir, priorBuild)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	if err := atomicfile.Write(filepath.Join(dir, lastBuild), func(f io.Writer) error { return json.NewEncoder(f).Encode(now) }); err != nil {
		return nil, err
	}
	return explain.Explain(now, prev), nil
}

// Explain reads the records of the last two builds and explains the last.
func Explain(opts Options) ([]explain.Explanation, error) {
	root, err := opts.RootDir()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(opts.OutDirFor(root), explainDir)
	now, err := readRecord(filepath.Join(dir, lastBuild))
	if err != nil {
		return nil, err
	}
	if now == nil {
		return nil, fmt.Errorf("no build recorded in %s: run `mage images` first", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, noopMarker)); err == nil {
		// The last build was a no-op answered from its record: it reused
		// every step of the one recorded.
		for i := range now.Steps {
			now.Steps[i].Cached = true
		}
		return explain.Explain(*now, nil), nil
	}
	prev, err := readRecord(filepath.Join(dir, priorBuild))
	if err != nil {
		return nil, err
	}
	return explain.Explain(*now, prev), nil
}

func readRecord(path string) (*explain.Record, error) {
	return atomicfile.ReadJSON[explain.Record](path, "build record")
}
