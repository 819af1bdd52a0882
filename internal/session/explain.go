package session

import (
	"path/filepath"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/explain"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/uptodate"
)

// explainDir holds, under the output folder, the records builds leave.
const explainDir = "explain"

// readOutputs is the up-to-date record of the outputs under outDir.
func readOutputs(outDir string) *uptodate.Outputs {
	return uptodate.ReadOutputs(filepath.Join(outDir, explainDir, uptodate.OutputsFile))
}

// sourceHashesPath is the source digests' record of the outputs under outDir.
func sourceHashesPath(outDir string) string {
	return filepath.Join(outDir, explainDir, uptodate.SourceHashesFile)
}

// record keeps this build's step inputs and outcomes for `mage explain`.
func record(opts Options, p *plan.Plan, inputs explain.Inputs, steps buildkit.Steps) ([]explain.Explanation, error) {
	return explain.Save(filepath.Join(opts.OutDirFor(p.Root), explainDir), inputs, steps)
}

// Explain explains the last build of the tree opts build.
func Explain(opts Options) ([]explain.Explanation, error) {
	root, err := opts.RootDir()
	if err != nil {
		return nil, err
	}
	return explain.Last(filepath.Join(opts.OutDirFor(root), explainDir))
}
