package verify

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit/export"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// SizeOutputs are where `mage size` writes its report, under the output dir.
const (
	sizeDir    = "size"
	sizeJSON   = "report.json"
	sizeSVG    = "report.svg"
	sizeBinDir = ".work"
)

// Size builds every binary for every platform twice, as shipped and with
// its symbol table (only the link differs), attributes the shipped size to
// modules and packages, compares with the previous report and writes
// report.json and report.svg under <out>/size/.
func Size(ctx context.Context, opts session.Options) (*inspect.SizeReport, error) {
	s, err := session.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	dir := filepath.Join(opts.OutDirFor(s.Plan.Root), sizeDir)
	work := filepath.Join(dir, sizeBinDir)
	var files []export.FileCopy
	for _, target := range s.Plan.Platforms {
		for _, b := range s.Plan.Binaries {
			pd := golang.PlatformDir(target)
			files = append(files,
				export.FileCopy{From: s.Binary(b.Name, target), Src: "/" + b.Name, Dest: "/stripped/" + pd + "/" + b.Name},
				export.FileCopy{From: s.BinaryWithSymbols(b.Name, target), Src: "/" + b.Name, Dest: "/symbols/" + pd + "/" + b.Name})
		}
	}
	if _, _, err := s.ExportFiles(ctx, "size", files, work, nil); err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	report := &inspect.SizeReport{}
	for _, target := range s.Plan.Platforms {
		for _, b := range s.Plan.Binaries {
			pd := golang.PlatformDir(target)
			stripped, err := os.ReadFile(filepath.Join(work, "stripped", pd, b.Name))
			if err != nil {
				return nil, err
			}
			symbols, err := os.ReadFile(filepath.Join(work, "symbols", pd, b.Name))
			if err != nil {
				return nil, err
			}
			e, err := inspect.Breakdown(b.Name, pd, stripped, symbols)
			if err != nil {
				return nil, err
			}
			e.Platform = config.FormatPlatform(target)
			e.Budget = s.Plan.Budgets[b.Name]
			report.Entries = append(report.Entries, e)
		}
	}
	prev, err := atomicfile.ReadJSON[inspect.SizeReport](filepath.Join(dir, sizeJSON), "size report")
	if err != nil {
		return nil, err
	}
	report.CompareTo(prev)
	if err := atomicfile.Write(filepath.Join(dir, sizeJSON), func(f io.Writer) error {
		enc := json.NewEncoder(f)
		enc.SetIndent("", "  ")
		return enc.Encode(report)
	}); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(filepath.Join(dir, sizeSVG), func(f io.Writer) error { return report.WriteSVG(f) }); err != nil {
		return nil, err
	}
	return report, nil
}

// SizePaths returns where Size writes its JSON and SVG.
func SizePaths(opts session.Options) (string, string, error) {
	root, err := opts.RootDir()
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(opts.OutDirFor(root), sizeDir)
	return filepath.Join(dir, sizeJSON), filepath.Join(dir, sizeSVG), nil
}
