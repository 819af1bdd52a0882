package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/verify"
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
func Size(ctx context.Context, opts Options) (*verify.SizeReport, error) {
	s, err := Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	dir := filepath.Join(opts.OutDirFor(s.Plan.Root), sizeDir)
	work := filepath.Join(dir, sizeBinDir)
	var files []buildkit.FileCopy
	for _, target := range s.Plan.Platforms {
		for _, b := range s.Plan.Binaries {
			pd := golang.PlatformDir(target)
			files = append(files,
				buildkit.FileCopy{From: s.Binary(b.Name, target), Src: "/" + b.Name, Dest: "/stripped/" + pd + "/" + b.Name},
				buildkit.FileCopy{From: s.BinaryWithSymbols(b.Name, target), Src: "/" + b.Name, Dest: "/symbols/" + pd + "/" + b.Name})
		}
	}
	if _, _, err := s.ExportFiles(ctx, "size", files, work, nil); err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	report := &verify.SizeReport{}
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
			e, err := verify.Breakdown(b.Name, pd, stripped, symbols)
			if err != nil {
				return nil, err
			}
			e.Platform = target.OS + "/" + target.Architecture + variant(target.Variant)
			e.Budget = s.Plan.Budgets[b.Name]
			report.Entries = append(report.Entries, e)
		}
	}
	prev, err := readJSON[verify.SizeReport](filepath.Join(dir, sizeJSON), "size report")
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
func SizePaths(opts Options) (string, string, error) {
	root, err := opts.root()
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(opts.OutDirFor(root), sizeDir)
	return filepath.Join(dir, sizeJSON), filepath.Join(dir, sizeSVG), nil
}

func variant(v string) string {
	if v == "" {
		return ""
	}
	return "/" + v
}

// readJSON reads a JSON file kiln wrote earlier; a missing file is nil.
func readJSON[T any](path, what string) (*T, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("%s: not a %s (delete it to start afresh): %w", path, what, err)
	}
	return &v, nil
}
